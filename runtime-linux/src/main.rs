//! `pinch` for Linux and Android.
fn main() {
    eprintln!("pinch: not yet wired");
    std::process::exit(2);
}
