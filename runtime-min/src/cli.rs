//! Command-line options, parsed without allocation. Flag names follow llama.cpp
//! (`-m`, `-p`, `-n`, `-t`, `-c`, `-b`, `--temp`, `--top-k` ...) so users can reuse theirs.
use crate::model::{KvType, Math};
use crate::sampler::{SamplerParams, RANDOM_SEED};

/// The draft source of speculative decoding (`--spec-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecType {
    /// N-gram matches in the text so far (`crate::draft::PromptLookup`).
    Lookup,
    /// The model's multi-token-prediction block (`crate::model::mtp`).
    Mtp,
}

/// The subcommand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Run,
    Chat,
    Ppl,
    Tokenize,
    Bench,
    Inspect,
    Serve,
    /// Choose the rows of a pruned LM head from a corpus (`crate::head`).
    HeadSelect,
    /// Write a GGUF whose `output.weight` holds only a head's rows.
    Recut,
    /// Replay a MoE routing trace through expert pools (`crate::pager::sim`).
    MoeSim,
    /// Generate long answers and score them for loops (`commands::loops`).
    Loops,
    /// Measure the device and recommend settings (`commands::tune`).
    Tune,
    /// Write the logits of a token-id sequence (`commands::logits`).
    Logits,
    Help,
}

/// Everything a command may use; each ignores what it does not need.
#[derive(Clone, Debug)]
pub struct Opts<'s> {
    pub command: Command,
    pub model: Option<&'s str>,
    pub prompt: Option<&'s str>,
    pub file: Option<&'s str>,
    pub n_predict: usize,
    pub threads: usize,
    /// 0 = the command's default (2048; ppl: 512).
    pub n_ctx: usize,
    pub n_batch: usize,
    /// `-b` was given (ppl then passes `n_batch` tokens at a time instead of a whole
    /// window: with `--state-f16` the state is rounded after every pass, as in generation).
    pub n_batch_given: bool,
    /// ppl: bits per byte in windows that move by this many tokens, each scoring only
    /// its last ones (`--ppl-stride N`, llama-perplexity's flag; 0: windows side by side).
    pub ppl_stride: usize,
    pub sampler: SamplerParams,
    pub budget: Option<u64>,
    pub json: bool,
    /// K cache type (`-ctk`).
    pub kv: KvType,
    /// V cache type (`-ctv`).
    pub kv_v: KvType,
    pub math: Math,
    pub ignore_eos: bool,
    /// run, chat, serve: most tokens a prompt-lookup draft proposes (`--draft N`,
    /// llama.cpp's `--draft-max`); `None`: on only when the plan streams weights, 0: off.
    pub draft: Option<usize>,
    /// What drafts (`--spec-type`): the model's MTP block where it has one pinch can
    /// run, else prompt lookup (`None`); or one of them.
    pub spec_type: Option<SpecType>,
    /// MTP drafts stop at a guess less likely than this (`--draft-p-min`, llama.cpp's
    /// default 0).
    pub draft_p_min: f32,
    pub ids: bool,
    pub no_bos: bool,
    pub parse_special: bool,
    pub system: Option<&'s str>,
    /// chat, serve: `--chat-template NAME|FILE` (a built-in name, a Jinja file, or Jinja
    /// text) and `--chat-template-file FILE` (wins over it).
    pub chat_template: Option<&'s str>,
    pub chat_template_file: Option<&'s str>,
    /// run: constrained output, as llama-cli: `--grammar GBNF`, `--grammar-file FILE`,
    /// `-j/--json-schema JSON`.
    pub grammar: Option<&'s str>,
    pub grammar_file: Option<&'s str>,
    pub json_schema: Option<&'s str>,
    /// bench: prompt lengths, generation length, thread counts, repetitions.
    pub bench_p: heapless::Vec<usize, 8>,
    pub bench_t: heapless::Vec<usize, 8>,
    pub bench_reps: usize,
    /// bench: tokens already in the cache before each test (`-d`).
    pub bench_depth: usize,
    pub verbose: bool,
    /// Attention skips keys whose weight is below 1e-4 of the best. `None`: the
    /// command's default (on, except for `ppl` and `logits`, which measure the exact model).
    pub attn_skip: Option<bool>,
    /// `--swa-full`: sliding-window layers keep a row per position of the context
    /// (llama.cpp's flag), not only their window.
    pub swa_full: bool,
    /// Keep recurrent layers' delta-rule matrices in f16 (`--state-f16`).
    pub state_f16: bool,
    /// moe-sim: expert slots per MoE layer (`--pool`).
    pub moe_pool: usize,
    /// `moe-sim --from N`: replay the first N tokens without counting them.
    pub moe_from: usize,
    /// moe-sim: the pool's eviction policy (`--policy lfu|lru`).
    pub moe_policy: crate::pager::Policy,
    /// moe-sim: bytes of one expert (its three matrices), for bytes per token.
    pub expert_bytes: Option<u64>,
    /// The expert pager's run options (MoE models under `--budget`).
    pub moe: MoeOpts<'s>,
    /// Print where the time went (per kind of operation) at the end.
    pub profile: bool,
    /// serve: address, port (0: any free port) and how many requests may wait.
    pub host: &'s str,
    pub port: u16,
    pub queue: usize,
    /// Pruned LM head: a `head.ids` file (`--head`), or rows to pick from `--corpus`
    /// at load time (`--head-rows`); head-select: rows to keep (`--rows`).
    pub head: Option<&'s str>,
    pub head_rows: usize,
    /// Comma-separated text files or directories holding a `files.txt` list.
    pub corpus: &'s str,
    /// Memory guard floor in bytes (`--guard`; `None`: the default 180 MiB, 0: off).
    pub guard: Option<u64>,
    /// The storage's sequential read bandwidth in bytes per second (`--read-bw`, as
    /// measured by `pinch bench --storage FILE`), for the plan's speed ceiling.
    pub read_bw: Option<u64>,
    /// Compare every streamed tensor and paged expert with the file (`--verify-stream`).
    pub verify_stream: bool,
    /// bench: measure the read bandwidth of this file instead of a model (`--storage`).
    pub storage: Option<&'s str>,
    /// bench: measure the memory read bandwidth at `-t` threads instead (`--membw`).
    pub membw: bool,
    /// bench --membw: bytes of the buffer read (`--membw-bytes`; 0 = the default).
    pub membw_bytes: u64,
    /// Directory of repacked-weight caches (`--repack-cache`, see `crate::repack_cache`).
    pub repack_cache: Option<&'s str>,
    /// Keep Q8_0 matrices in the file's row order (`--no-repack`; for comparisons).
    pub no_repack: bool,
    /// Q1_0 / Q2_0 through 8-bit lookup tables (`--lut8`): faster, not llama.cpp's
    /// arithmetic.
    pub lut8: bool,
    /// head-select / recut: write the result to this file (`-o`; `None` or `-`: stdout).
    pub output: Option<&'s str>,
    /// loops: plain prompts, no chat template (`--plain`, for base models).
    pub plain: bool,
    /// head selection: language weights over the corpus files (`--head-lang en=3,code`).
    pub head_lang: Option<&'s str>,
    /// head-select: rank by the model's own predictions over the corpus too (`--soft`).
    pub soft: bool,
    /// head-select: tokens of the model's own free text whose predictions rank too
    /// (`--generate N`; 0: none).
    pub generate: usize,
    /// head-select: weight of the model's own text against the corpus, in multiples of
    /// the corpus's tokens (`--generate-weight X`; default 4, 1 with `--soft`).
    pub generate_weight: Option<f32>,
    /// head-select: start each document of the model's own text with this many tokens
    /// of a line of the corpus (`--generate-seed K`, default 16; 0: from BOS alone).
    pub generate_seed: usize,
    /// head-select: begin those documents with lines of this file instead of the
    /// corpus's (`--generate-from FILE`: topics the head should know).
    pub generate_from: Option<&'s str>,
    /// head-select: write the model's expected counts over the corpus (`--soft`) or
    /// over its own text (`--generate`) to this file (`--save-soft`).
    pub save_soft: Option<&'s str>,
    /// head-select: read those counts from `--save-soft` files (comma-separated)
    /// instead of running the model (`--load-soft`).
    pub load_soft: Option<&'s str>,
    /// serve, llama-server's flags: `--alias`, `--api-key`, `--parallel`,
    /// `--chat-template NAME`, `--chat-template-file FILE`, `--no-webui`, `--no-slots`,
    /// `--no-metrics`, `--cors-origins localhost`.
    pub serve: ServeFlags<'s>,
    /// A `pinch tune` profile whose settings are the defaults (`--tune FILE`).
    pub tune: Option<&'s str>,
}

/// `pinch serve`'s llama-server flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServeFlags<'s> {
    pub alias: Option<&'s str>,
    pub api_key: Option<&'s str>,
    /// Generation slots of `serve` (decoded together), streams of `bench`.
    pub parallel: usize,
    pub chat_template: Option<&'s str>,
    pub chat_template_file: Option<&'s str>,
    pub no_webui: bool,
    pub no_slots: bool,
    pub no_metrics: bool,
    pub cors_origins: Option<&'s str>,
    /// `--tags a,b`: labels `/v1/models` reports.
    pub tags: Option<&'s str>,
}

/// A command line pinch cannot act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CliError<'s> {
    UnknownCommand(&'s str),
    UnknownFlag(&'s str),
    MissingValue(&'s str),
    BadValue { flag: &'s str, value: &'s str },
}

impl core::fmt::Display for CliError<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CliError::UnknownCommand(c) => write!(f, "unknown command '{c}' (try: pinch help)"),
            CliError::UnknownFlag(x) => write!(f, "unknown flag '{x}' (try: pinch help)"),
            CliError::MissingValue(x) => write!(f, "flag '{x}' needs a value"),
            CliError::BadValue { flag, value } => write!(f, "bad value '{value}' for '{flag}'"),
        }
    }
}

pub const USAGE: &str = "\
pinch: run the largest language model a small device can hold

usage: pinch <command> [flags]

commands:
  run       generate text:       pinch run -m model.gguf -p \"Once upon a time\" -n 64
  chat      interactive chat in the terminal (uses the model's chat template)
  ppl       perplexity and bits per byte of a text file: pinch ppl -m M -f text.txt -c 512
  tokenize  print token ids/pieces: pinch tokenize -m M -p TEXT [--ids] [--no-bos] [--no-parse-special]
  logits    raw f32 logits of token ids, every position: pinch logits -m M -p 1,17,42 -o out.f32
  bench     tokens/s table:      pinch bench -m M -p 64,512 -n 128 -t 1,2 -r 3
            storage read speed:  pinch bench --storage FILE (prints the --read-bw to pass)
  inspect   describe a GGUF file: pinch inspect model.gguf
  serve     HTTP server (OpenAI and llama-server APIs, web page): pinch serve -m M --port 8080
  head-select  rows of a pruned LM head:  pinch head-select -m M --corpus DIR --rows N -o head.ids
  recut     GGUF with a pruned head:      pinch recut -m M --head head.ids -o M2.gguf
  loops     long answers scored for loops: pinch loops -m M [-n 600] [--plain] [--repeat-penalty 1.15]
  moe-sim   replay a MoE routing trace:   pinch moe-sim TRACE --pool N --policy lfu|lru
  tune      measure this device, recommend flags and write them to a profile:
            pinch tune -m M [--budget SIZE] [-o M.tune]; then pinch run --tune M.tune -m M

flags (llama.cpp names):
  -m, --model FILE        GGUF model
  -p, --prompt TEXT       prompt (bench: comma-separated prompt lengths)
  -f, --file FILE         prompt/text file
  -n, --n-predict N       tokens to generate (default 128)
  -t, --threads N         worker threads (default: all cores; bench: comma list)
  -c, --ctx-size N        context length (default 2048, ppl 512, at most the model's;
                          a larger N is allowed, with a warning)
  -b, --batch-size N      prompt tokens per weight pass (default 64; ppl: the whole window)
  --ppl-stride N          ppl: bits per byte from windows of -c tokens that move by N,
                          each scoring its last N tokens (every token scored once, with
                          at least -c minus N tokens before it; default: side by side)
  --temp X --top-k N --top-p X --min-p X --repeat-penalty X --repeat-last-n N
  --presence-penalty X --frequency-penalty X --seed N
                          (llama.cpp's defaults and sampler chain, the same tokens for
                          the same seed; -s -1: a random seed; default seed 24301;
                          chat and serve: --repeat-penalty 1.15 --repeat-last-n 256,
                          which keeps long answers from looping)
  --budget SIZE           memory cap, e.g. 700M or 1.2G: the plan must fit under it
  --guard SIZE            stop generating when available memory falls under SIZE
                          (default 180M; 0 = off); checked once per token
  --read-bw RATE          storage read speed in bytes/s (K/M/G = 1e3/1e6/1e9), e.g.
                          278M, as `pinch bench --storage FILE` measures it: the plan
                          prints the speed ceiling it implies for streamed weights
  --verify-stream         compare every streamed tensor and paged expert with the file
  --storage FILE          bench: sequential read speed of FILE (direct and buffered)
  --membw                 bench: memory read bandwidth at -t threads (passes over
                          768 MiB, past the caches), the ceiling of weight reads
  --membw-bytes SIZE      bench --membw: the buffer's size instead (e.g. the
                          model's weights, to see what its reads meet)
  -ctk, --cache-type-k f32|f16|q8_0
                          K cache type (default f16; q8_0: llama.cpp's blocks of
                          32, 8.5 bits per value, needs head_dim % 32 == 0)
  -ctv, --cache-type-v f32|f16|q8_0
                          V cache type (default f16)
  --swa-full              sliding-window layers keep the whole context in the KV
                          cache (default: only their window, a ring; same logits)
  --state-f16             recurrent (DeltaNet) layers keep their state matrices in
                          f16: half their memory, rounded once per eval call
  --reference             f32 oracle arithmetic (slow; for checking)
  --attn-skip, --no-attn-skip
                          skip keys whose attention weight is < 1e-4 of the best
                          (default: on; off for ppl and logits, which measure the
                          exact model)
  --ignore-eos            do not stop at end-of-generation tokens
  --grammar GBNF, --grammar-file FILE, -j/--json-schema JSON
                          run, chat: the output (each reply) follows a GBNF grammar
                          or a JSON schema
  --draft N               run, chat, serve: speculative decoding, up to N (<= 16)
                          tokens drafted from the text so far and verified in one
                          pass (default 8 when weights stream, else 0 = off)
  --spec-type lookup|mtp  what drafts: the model's MTP (nextn) block, Qwen3.5's
                          (default where the file has one), or prompt lookup
  --draft-p-min P         mtp: stop drafting at a guess below probability P (0)
  --json                  print one JSON summary line at the end
  --profile               print the share of time per kind of operation
  -sys, --system TEXT     system prompt for chat
  --chat-template NAME|FILE
                          chat, serve: a llama.cpp template name (chatml, llama3, gemma,
                          phi3, mistral-v7, ...) or a Jinja template (file or text)
                          instead of the model's
  --chat-template-file FILE
                          chat, serve: the Jinja template in FILE instead of the model's
  -r, --repetitions N     bench repetitions (default 3)
  -d, --n-depth N         bench: tokens already in the context before each test
  --host ADDR --port N    serve: listen address (default 127.0.0.1:8080)
  --queue N               serve: requests that may wait for the running one (default 4)
  --alias A[,B..]         serve: the model's names (the first in sort order is its id)
  --tags T[,U..]          serve: labels /v1/models reports
  --api-key KEY           serve: requests need 'Authorization: Bearer KEY' (or X-Api-Key)
  --parallel N            serve: N generation slots, their answers decoded together in
                          one weight pass per token (not for qwen35/lfm2); bench:
                          generation with 1, 2, 4 .. N streams decoded together
                          (both: -c split, c/N each, rounded up to 256; N at most 16)
  --chat-template NAME|--chat-template-file FILE
                          serve: chat format instead of the model's (chatml, gemma, llama3)
  --cors-origins localhost  serve: CORS only for loopback origins (default: any)
  --no-webui --no-slots --no-metrics
                          serve: turn off the page, /slots, /metrics (501)
  --head FILE             pruned LM head from a head.ids file (head-select's output)
  --head-rows N           pruned LM head of N rows chosen from --corpus at load time
  --corpus LIST           comma-separated text files, or directories with a files.txt
                          list (default tests/data/corpus)
  --head-lang LIST        head selection: weight the corpus files by language, named by
                          file (en.txt: en): en,code or en=3,code=1 (others weigh 0)
  --soft                  head-select: add the model's predicted probabilities over the
                          corpus to the counts (runs the model in windows of -c tokens,
                          default 32; ranks far better)
  --generate N            head-select: let the model write N tokens of its own text
                          (documents of -n tokens, each from the first 16 tokens of a
                          line of the corpus, --generate-seed K; the sampling flags)
                          and add its predicted probabilities at each of them, weighed
                          --generate-weight X (default 4; 1 with --soft) times the
                          corpus's tokens;
                          --generate-from FILE: begin them with FILE's lines instead
  --save-soft FILE        head-select: keep the probabilities --soft or --generate
                          computed; --load-soft FILE[,FILE..] ranks from them again
                          (other --rows) without the model's time (--soft's: same
                          corpus and --head-lang; files of own text add up)
  --plain                 loops: prompts as plain text, no chat template (base models)
  -o, --output FILE       head-select, recut: write FILE (atomically) instead of stdout
  --pool N                moe-sim: expert slots per MoE layer
  --policy lfu|lru        moe-sim: eviction (decayed use frequency, or least recent)
  --expert-bytes SIZE     moe-sim: bytes of one expert, for bytes read per token
  --from N                moe-sim: count from token N on (the first N only warm the pools)
  --policy lfu|lru        run: the expert pools' eviction too (default lfu)
  --moe-trace FILE        write which experts each token used per MoE layer (for moe-sim)
  --moe-warm FILE         start the expert pools from FILE's hot list if it exists, and
                          write the run's hot list there at the end
  --moe-prefetch          read the next MoE layer's likely experts ahead (its router on
                          the current hidden state); wrong guesses cost reads only
  --moe-bias X            add X to the router scores of experts already in memory
                          (fewer reads, inexact: prints the KL cost on a short text)
  --experts N             use N experts per token instead of the model's (inexact)
  --moe-readers N         expert reads at once on I/O threads (default 4; 1: one by one)
  --repack-cache DIR      Q8_0 matrices are repacked at load (row-interleaved, the faster
                          kernel layout); keep them in DIR/<model>.pinch-repack: the first
                          run writes it, later runs read it; rebuilt when the model changes
  --no-repack             keep Q8_0 matrices in the file's row order
  --lut8                  Q1_0 / Q2_0 (1- and 2-bit) matrices through 8-bit lookup tables
                          on aarch64: fewer instructions, not bit-exact with llama.cpp
                          (about 1 % RMS error per product); elsewhere the exact kernels run
  --tune FILE             run, chat, serve: settings from a `pinch tune` profile (flags
                          given on the command line win)
";

/// The expert pager's options for a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MoeOpts<'s> {
    /// `--moe-trace FILE`: write the routing trace there.
    pub trace: Option<&'s str>,
    /// `--moe-warm FILE`: read the hot list at start, write it at the end.
    pub warm: Option<&'s str>,
    /// `--moe-prefetch`.
    pub prefetch: bool,
    /// `--moe-bias X`.
    pub bias: f32,
    /// `--experts N`.
    pub experts: Option<usize>,
    /// `--moe-readers N`.
    pub readers: Option<usize>,
}

/// `pinch chat` and `pinch serve` penalize the last 256 tokens by 1.15 unless told
/// otherwise: small chat models loop in long answers without it (`pinch loops`, 13
/// prompts x 300 tokens: Gemma 3 270M 12 of 13 answers degenerate at llama.cpp's
/// defaults, 0 of 13 with the penalty). `run` and the rest keep llama.cpp's defaults.
pub const CHAT_REPEAT_PENALTY: f32 = 1.15;
/// See [`CHAT_REPEAT_PENALTY`].
pub const CHAT_REPEAT_LAST_N: usize = 256;

fn default_sampler(command: Command) -> SamplerParams {
    let mut s = SamplerParams::default();
    if matches!(command, Command::Chat | Command::Serve) {
        s.repeat_penalty = CHAT_REPEAT_PENALTY;
        s.repeat_last_n = CHAT_REPEAT_LAST_N;
    }
    s
}

/// Parse a rate in bytes per second: `278M`, `1.5G`, `900k`, `123456`, optionally
/// followed by `B/s`, `B` or `/s`. K/M/G are powers of 1000 here (as storage speeds are
/// quoted): `278M` is 278e6 B/s. Zero is refused (a rate of nothing plans nothing).
pub fn parse_rate(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_suffix("/s").unwrap_or(s);
    let s = s.strip_suffix('B').unwrap_or(s);
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1e3),
        b'm' | b'M' => (&s[..s.len() - 1], 1e6),
        b'g' | b'G' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    let r = v * mult;
    if !(r.is_finite() && r >= 1.0 && r < u64::MAX as f64) {
        return None;
    }
    Some(r as u64)
}

/// Parse `700M`, `1.5G`, `64K`, `123456` (bytes; K/M/G are powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_suffix("iB")
        .or_else(|| s.strip_suffix('B'))
        .unwrap_or(s);
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1u64 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1u64 << 30),
        _ => (s, 1),
    };
    let v: f64 = num.parse().ok()?;
    if !(v.is_finite() && v >= 0.0) {
        return None;
    }
    Some((v * mult as f64) as u64)
}

fn list(flag: &str, v: &str) -> Option<heapless::Vec<usize, 8>> {
    let _ = flag;
    let mut out = heapless::Vec::new();
    for part in v.split(',') {
        out.push(part.trim().parse().ok()?).ok()?;
    }
    Some(out)
}

impl<'s> Opts<'s> {
    fn defaults(command: Command) -> Opts<'s> {
        Opts {
            command,
            model: None,
            prompt: None,
            file: None,
            n_predict: if command == Command::Loops { 600 } else { 128 },
            threads: 0,
            n_ctx: 0,
            n_batch: 64,
            n_batch_given: false,
            sampler: default_sampler(command),
            budget: None,
            json: false,
            kv: KvType::F16,
            kv_v: KvType::F16,
            math: Math::Fast,
            ignore_eos: false,
            grammar: None,
            grammar_file: None,
            json_schema: None,
            draft: None,
            spec_type: None,
            draft_p_min: 0.0,
            ids: false,
            no_bos: false,
            parse_special: true,
            system: None,
            chat_template: None,
            chat_template_file: None,
            bench_p: heapless::Vec::from_slice(&[64, 512]).unwrap_or_default(),
            bench_t: heapless::Vec::new(),
            bench_reps: 3,
            bench_depth: 0,
            verbose: false,
            attn_skip: None,
            swa_full: false,
            state_f16: false,
            moe_pool: 0,
            moe_from: 0,
            moe_policy: crate::pager::Policy::LFU,
            expert_bytes: None,
            moe: MoeOpts::default(),
            profile: false,
            host: "127.0.0.1",
            port: 8080,
            queue: 4,
            head: None,
            head_rows: 0,
            corpus: "tests/data/corpus",
            guard: None,
            read_bw: None,
            verify_stream: false,
            storage: None,
            membw: false,
            membw_bytes: 0,
            repack_cache: None,
            no_repack: false,
            lut8: false,
            output: None,
            plain: false,
            head_lang: None,
            soft: false,
            generate: 0,
            ppl_stride: 0,
            generate_weight: None,
            generate_seed: 16,
            generate_from: None,
            save_soft: None,
            load_soft: None,
            serve: ServeFlags::default(),
            tune: None,
        }
    }

    /// Parse `args` (without the program name).
    pub fn parse(args: &[&'s str]) -> Result<Opts<'s>, CliError<'s>> {
        Opts::parse_with(args, &|_| {})
    }

    /// Parse `args` over defaults that `base` changed first (a `--tune` profile's
    /// settings), so the flags in `args` win.
    pub fn parse_with(
        args: &[&'s str],
        base: &dyn Fn(&mut Opts<'s>),
    ) -> Result<Opts<'s>, CliError<'s>> {
        let Some((&cmd, rest)) = args.split_first() else {
            return Ok(Opts::defaults(Command::Help));
        };
        let command = match cmd {
            "run" => Command::Run,
            "chat" => Command::Chat,
            "ppl" | "perplexity" => Command::Ppl,
            "tokenize" => Command::Tokenize,
            "bench" => Command::Bench,
            "inspect" => Command::Inspect,
            "serve" | "server" => Command::Serve,
            "head-select" => Command::HeadSelect,
            "recut" => Command::Recut,
            "moe-sim" => Command::MoeSim,
            "loops" => Command::Loops,
            "tune" => Command::Tune,
            "logits" => Command::Logits,
            "help" | "-h" | "--help" => Command::Help,
            other => return Err(CliError::UnknownCommand(other)),
        };
        let mut o = Opts::defaults(command);
        base(&mut o);
        let mut i = 0;
        while i < rest.len() {
            let flag = rest[i];
            let mut val = || -> Result<&'s str, CliError<'s>> {
                i += 1;
                rest.get(i).copied().ok_or(CliError::MissingValue(flag))
            };
            macro_rules! num {
                () => {{
                    let v = val()?;
                    v.parse()
                        .map_err(|_| CliError::BadValue { flag, value: v })?
                }};
            }
            match flag {
                "-m" | "--model" => o.model = Some(val()?),
                "-p" | "--prompt" => {
                    let v = val()?;
                    if command == Command::Bench {
                        o.bench_p = list(flag, v).ok_or(CliError::BadValue { flag, value: v })?;
                    } else {
                        o.prompt = Some(v);
                    }
                }
                "-f" | "--file" => o.file = Some(val()?),
                "-n" | "--n-predict" => {
                    let v = val()?;
                    // llama.cpp's -1: until the context is full.
                    o.n_predict = match v {
                        "-1" => usize::MAX,
                        _ => v
                            .parse()
                            .map_err(|_| CliError::BadValue { flag, value: v })?,
                    };
                }
                "--alias" => o.serve.alias = Some(val()?),
                "--api-key" => o.serve.api_key = Some(val()?),
                "-np" | "--parallel" => o.serve.parallel = num!(),
                "--cors-origins" => o.serve.cors_origins = Some(val()?),
                "--tags" => o.serve.tags = Some(val()?),
                "--no-webui" | "--no-ui" => o.serve.no_webui = true,
                "--no-slots" => o.serve.no_slots = true,
                "--slots" => o.serve.no_slots = false,
                "--no-metrics" => o.serve.no_metrics = true,
                "--metrics" => o.serve.no_metrics = false,
                "-t" | "--threads" => {
                    let v = val()?;
                    let l = list(flag, v).ok_or(CliError::BadValue { flag, value: v })?;
                    o.threads = l.first().copied().unwrap_or(0);
                    o.bench_t = l;
                }
                "-c" | "--ctx-size" => o.n_ctx = num!(),
                "-b" | "--batch-size" | "-ub" | "--ubatch-size" => {
                    o.n_batch = num!();
                    o.n_batch_given = true;
                }
                "--temp" => o.sampler.temp = num!(),
                "--top-k" => o.sampler.top_k = num!(),
                "--top-p" => o.sampler.top_p = num!(),
                "--min-p" => o.sampler.min_p = num!(),
                "--repeat-penalty" => o.sampler.repeat_penalty = num!(),
                "--repeat-last-n" => o.sampler.repeat_last_n = num!(),
                "--presence-penalty" => o.sampler.presence_penalty = num!(),
                "--frequency-penalty" => o.sampler.frequency_penalty = num!(),
                "-s" | "--seed" => {
                    let v = val()?;
                    o.sampler.seed = match v {
                        "-1" => RANDOM_SEED,
                        _ => v
                            .parse()
                            .map_err(|_| CliError::BadValue { flag, value: v })?,
                    };
                }
                "-r" | "--repetitions" => o.bench_reps = num!(),
                "-d" | "--n-depth" => o.bench_depth = num!(),
                "--budget" => {
                    let v = val()?;
                    o.budget = Some(parse_size(v).ok_or(CliError::BadValue { flag, value: v })?);
                }
                "-ctk" | "--cache-type-k" | "-ctv" | "--cache-type-v" => {
                    let v = val()?;
                    let ty = KvType::parse(v).ok_or(CliError::BadValue { flag, value: v })?;
                    match flag {
                        "-ctk" | "--cache-type-k" => o.kv = ty,
                        _ => o.kv_v = ty,
                    }
                }
                "-sys" | "--system" => o.system = Some(val()?),
                "--chat-template" => o.chat_template = Some(val()?),
                "--chat-template-file" => o.chat_template_file = Some(val()?),
                "--reference" => o.math = Math::Reference,
                "--no-attn-skip" => o.attn_skip = Some(false),
                "--swa-full" => o.swa_full = true,
                "--state-f16" => o.state_f16 = true,
                "--pool" => o.moe_pool = num!(),
                "--from" => o.moe_from = num!(),
                "--policy" => {
                    let v = val()?;
                    o.moe_policy = crate::pager::Policy::from_name(v)
                        .ok_or(CliError::BadValue { flag, value: v })?;
                }
                "--expert-bytes" => {
                    let v = val()?;
                    o.expert_bytes =
                        Some(parse_size(v).ok_or(CliError::BadValue { flag, value: v })?);
                }
                "--moe-trace" => o.moe.trace = Some(val()?),
                "--moe-warm" => o.moe.warm = Some(val()?),
                "--moe-prefetch" => o.moe.prefetch = true,
                "--moe-bias" => o.moe.bias = num!(),
                "--experts" => o.moe.experts = Some(num!()),
                "--moe-readers" => o.moe.readers = Some(num!()),
                "--attn-skip" => o.attn_skip = Some(true),
                "--profile" => o.profile = true,
                "--ignore-eos" => o.ignore_eos = true,
                "--grammar" => o.grammar = Some(val()?),
                "--grammar-file" => o.grammar_file = Some(val()?),
                "-j" | "--json-schema" => o.json_schema = Some(val()?),
                "--draft" | "--draft-max" | "--draft-n" => {
                    let v = val()?;
                    let n: usize = v
                        .parse()
                        .map_err(|_| CliError::BadValue { flag, value: v })?;
                    if n > crate::draft::MAX_DRAFT {
                        return Err(CliError::BadValue { flag, value: v });
                    }
                    o.draft = Some(n);
                }
                "--spec-type" => {
                    let v = val()?;
                    o.spec_type = Some(match v {
                        "lookup" | "ngram-simple" => SpecType::Lookup,
                        "mtp" | "draft-mtp" => SpecType::Mtp,
                        _ => return Err(CliError::BadValue { flag, value: v }),
                    });
                }
                "--draft-p-min" | "--spec-draft-p-min" => {
                    let v = val()?;
                    o.draft_p_min = v
                        .parse()
                        .ok()
                        .filter(|p: &f32| (0.0..=1.0).contains(p))
                        .ok_or(CliError::BadValue { flag, value: v })?;
                }
                "--json" => o.json = true,
                "--ids" => o.ids = true,
                "--no-bos" => o.no_bos = true,
                "--no-parse-special" => o.parse_special = false,
                "-v" | "--verbose" => o.verbose = true,
                "--host" => o.host = val()?,
                "--port" => o.port = num!(),
                "--queue" => o.queue = num!(),
                "--head" => o.head = Some(val()?),
                "--head-rows" | "--rows" => o.head_rows = num!(),
                "--corpus" => o.corpus = val()?,
                "--head-lang" => o.head_lang = Some(val()?),
                "--plain" => o.plain = true,
                "--soft" => o.soft = true,
                "--generate" => o.generate = num!(),
                "--ppl-stride" => o.ppl_stride = num!(),
                "--generate-weight" => o.generate_weight = Some(num!()),
                "--generate-seed" => o.generate_seed = num!(),
                "--generate-from" => o.generate_from = Some(val()?),
                "--save-soft" => o.save_soft = Some(val()?),
                "--load-soft" => o.load_soft = Some(val()?),
                "--guard" => {
                    let v = val()?;
                    o.guard = Some(parse_size(v).ok_or(CliError::BadValue { flag, value: v })?);
                }
                "--read-bw" => {
                    let v = val()?;
                    o.read_bw = Some(parse_rate(v).ok_or(CliError::BadValue { flag, value: v })?);
                }
                "--verify-stream" => o.verify_stream = true,
                "--storage" => o.storage = Some(val()?),
                "--membw" => o.membw = true,
                "--membw-bytes" => {
                    let v = val()?;
                    o.membw_bytes = parse_size(v).ok_or(CliError::BadValue { flag, value: v })?;
                }
                "--repack-cache" => o.repack_cache = Some(val()?),
                "--no-repack" => o.no_repack = true,
                "--lut8" => o.lut8 = true,
                "-o" | "--output" => o.output = Some(val()?),
                "--tune" => o.tune = Some(val()?),
                "-h" | "--help" => o.command = Command::Help,
                other
                    if !other.starts_with('-')
                        && o.model.is_none()
                        && command == Command::Inspect =>
                {
                    o.model = Some(other)
                }
                other
                    if !other.starts_with('-')
                        && o.file.is_none()
                        && command == Command::MoeSim =>
                {
                    o.file = Some(other)
                }
                other => return Err(CliError::UnknownFlag(other)),
            }
            i += 1;
        }
        if o.n_batch == 0 {
            return Err(CliError::BadValue {
                flag: "-b",
                value: "0",
            });
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_cpp_style_flags() {
        let o = Opts::parse(&[
            "run", "-m", "x.gguf", "-p", "hi", "-n", "5", "--temp", "0", "--budget", "700M", "-t",
            "2",
        ])
        .unwrap();
        assert_eq!(o.command, Command::Run);
        assert_eq!(o.model, Some("x.gguf"));
        assert_eq!(o.n_predict, 5);
        assert_eq!(o.sampler.temp, 0.0);
        assert_eq!(o.budget, Some(700 << 20));
        assert_eq!(o.draft, None);
        assert_eq!(
            Opts::parse(&["run", "--draft-max", "4"]).unwrap().draft,
            Some(4)
        );
        assert_eq!(
            Opts::parse(&["serve", "--draft", "0"]).unwrap().draft,
            Some(0)
        );
        assert_eq!(
            Opts::parse(&["run", "--draft", "17"]).unwrap_err(),
            CliError::BadValue {
                flag: "--draft",
                value: "17"
            }
        );
        assert_eq!(o.threads, 2);
    }

    #[test]
    fn chat_and_serve_default_to_the_repetition_penalty_and_run_does_not() {
        for cmd in ["chat", "serve"] {
            let o = Opts::parse(&[cmd]).unwrap();
            assert_eq!(o.sampler.repeat_penalty, CHAT_REPEAT_PENALTY, "{cmd}");
            assert_eq!(o.sampler.repeat_last_n, CHAT_REPEAT_LAST_N, "{cmd}");
            let o = Opts::parse(&[cmd, "--repeat-penalty", "1", "--repeat-last-n", "64"]).unwrap();
            assert_eq!(
                (o.sampler.repeat_penalty, o.sampler.repeat_last_n),
                (1.0, 64)
            );
        }
        let o = Opts::parse(&["run"]).unwrap();
        let d = SamplerParams::default();
        assert_eq!(
            (o.sampler.repeat_penalty, o.sampler.repeat_last_n),
            (1.0, 64)
        );
        assert_eq!(o.sampler.repeat_penalty, d.repeat_penalty);
    }

    #[test]
    fn cache_types_set_k_and_v_separately() {
        let o = Opts::parse(&["run", "-ctk", "q8_0"]).unwrap();
        assert_eq!((o.kv, o.kv_v), (KvType::Q8_0, KvType::F16));
        let o = Opts::parse(&["run", "--cache-type-v", "q8_0", "-ctk", "f32"]).unwrap();
        assert_eq!((o.kv, o.kv_v), (KvType::F32, KvType::Q8_0));
        assert_eq!(
            Opts::parse(&["run", "-ctv", "q4_0"]).unwrap_err(),
            CliError::BadValue {
                flag: "-ctv",
                value: "q4_0"
            }
        );
    }

    #[test]
    fn rejects_unknown_flags_and_bad_values() {
        assert_eq!(
            Opts::parse(&["run", "--bogus"]).unwrap_err(),
            CliError::UnknownFlag("--bogus")
        );
        assert_eq!(
            Opts::parse(&["run", "-n", "x"]).unwrap_err(),
            CliError::BadValue {
                flag: "-n",
                value: "x"
            }
        );
        assert_eq!(
            Opts::parse(&["run", "-m"]).unwrap_err(),
            CliError::MissingValue("-m")
        );
        assert!(matches!(
            Opts::parse(&["frobnicate"]),
            Err(CliError::UnknownCommand("frobnicate"))
        ));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1.5G"), Some(1610612736));
        assert_eq!(parse_size("64k"), Some(65536));
        assert_eq!(parse_size("700MiB"), Some(700 << 20));
        assert_eq!(parse_size("-1M"), None);
        assert_eq!(parse_size("M"), None);
    }

    #[test]
    fn rates_are_decimal_bytes_per_second() {
        assert_eq!(parse_rate("278M"), Some(278_000_000));
        assert_eq!(parse_rate("278MB/s"), Some(278_000_000));
        assert_eq!(parse_rate("1.5G"), Some(1_500_000_000));
        assert_eq!(parse_rate("900k"), Some(900_000));
        assert_eq!(parse_rate("123456"), Some(123_456));
        assert_eq!(parse_rate(" 2g/s "), Some(2_000_000_000));
        for bad in ["", "M", "0", "0M", "-5M", "fast", "1e30G", "nan", "inf"] {
            assert_eq!(parse_rate(bad), None, "{bad}");
        }
    }

    #[test]
    fn repack_cache_and_output_flags() {
        let o = Opts::parse(&["run", "-m", "m.gguf", "--repack-cache", "/tmp/c"]).unwrap();
        assert_eq!(
            (o.repack_cache, o.output, o.no_repack),
            (Some("/tmp/c"), None, false)
        );
        assert!(
            Opts::parse(&["bench", "-m", "m", "--no-repack"])
                .unwrap()
                .no_repack
        );
        assert!(Opts::parse(&["run", "-m", "m", "--lut8"]).unwrap().lut8);
        assert!(!o.lut8);
        let o = Opts::parse(&["recut", "-m", "m", "--head", "h", "-o", "x.gguf"]).unwrap();
        assert_eq!(o.output, Some("x.gguf"));
        let o = Opts::parse(&["head-select", "-m", "m", "--output", "-"]).unwrap();
        assert_eq!(o.output, Some("-"));
        assert_eq!(
            Opts::parse(&["run", "--repack-cache"]).unwrap_err(),
            CliError::MissingValue("--repack-cache")
        );
    }

    #[test]
    fn expert_pager_flags() {
        let o = Opts::parse(&["run", "-m", "x.gguf"]).unwrap();
        assert_eq!(o.moe, MoeOpts::default());
        let o = Opts::parse(&[
            "run",
            "--moe-trace",
            "t.pmoe",
            "--moe-warm",
            "hot.txt",
            "--moe-prefetch",
            "--moe-bias",
            "0.3",
            "--experts",
            "4",
            "--policy",
            "lru",
            "--moe-readers",
            "2",
        ])
        .unwrap();
        let want = MoeOpts {
            trace: Some("t.pmoe"),
            warm: Some("hot.txt"),
            prefetch: true,
            bias: 0.3,
            experts: Some(4),
            readers: Some(2),
        };
        assert_eq!(o.moe, want);
        assert_eq!(o.moe_policy, crate::pager::Policy::Lru);
        assert!(matches!(
            Opts::parse(&["run", "--experts", "many"]),
            Err(CliError::BadValue { .. })
        ));
    }

    #[test]
    fn guard_read_bw_verify_stream_and_storage_flags() {
        let o = Opts::parse(&["run", "-m", "x.gguf"]).unwrap();
        assert_eq!((o.guard, o.read_bw, o.verify_stream), (None, None, false));
        let o = Opts::parse(&[
            "run",
            "--guard",
            "180M",
            "--read-bw",
            "278M",
            "--verify-stream",
        ])
        .unwrap();
        assert_eq!(o.guard, Some(180 << 20));
        assert_eq!(o.read_bw, Some(278_000_000));
        assert!(o.verify_stream);
        assert_eq!(
            Opts::parse(&["run", "--guard", "0"]).unwrap().guard,
            Some(0)
        );
        assert_eq!(
            Opts::parse(&["run", "--guard", "lots"]).unwrap_err(),
            CliError::BadValue {
                flag: "--guard",
                value: "lots"
            }
        );
        assert_eq!(
            Opts::parse(&["run", "--read-bw", "0"]).unwrap_err(),
            CliError::BadValue {
                flag: "--read-bw",
                value: "0"
            }
        );
        let o = Opts::parse(&["bench", "--storage", "/dev/x", "-r", "2"]).unwrap();
        assert_eq!(o.command, Command::Bench);
        assert_eq!(
            (o.storage, o.model, o.bench_reps),
            (Some("/dev/x"), None, 2)
        );
        assert_eq!(
            Opts::parse(&["bench", "--storage"]).unwrap_err(),
            CliError::MissingValue("--storage")
        );
    }

    #[test]
    fn tune_command_and_a_base_that_flags_override() {
        let o = Opts::parse(&["tune", "-m", "m.gguf", "--budget", "300M"]).unwrap();
        assert_eq!((o.command, o.budget), (Command::Tune, Some(300 << 20)));
        let args = ["run", "--tune", "p.tune", "-t", "3"];
        let o = Opts::parse_with(&args, &|x| {
            x.threads = 1;
            x.n_batch = 16;
        })
        .unwrap();
        assert_eq!(o.tune, Some("p.tune"));
        assert_eq!((o.threads, o.n_batch), (3, 16));
    }

    #[test]
    fn ppl_knows_whether_the_batch_was_given() {
        let o = Opts::parse(&["ppl", "-m", "m.gguf", "-f", "t.txt"]).unwrap();
        assert!(!o.n_batch_given);
        let o = Opts::parse(&["ppl", "-m", "m.gguf", "-f", "t.txt", "-b", "1"]).unwrap();
        assert!(o.n_batch_given && o.n_batch == 1);
    }

    #[test]
    fn bench_lists() {
        let o = Opts::parse(&["bench", "-p", "64,512", "-t", "1,2"]).unwrap();
        assert_eq!(&o.bench_p[..], &[64, 512]);
        assert_eq!(&o.bench_t[..], &[1, 2]);
    }
}
