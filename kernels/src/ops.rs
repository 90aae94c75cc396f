//! Elementwise and normalisation ops of the forward pass (scalar; f32).
