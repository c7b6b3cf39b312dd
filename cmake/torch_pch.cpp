// The translation unit that builds the precompiled <torch/torch.h> which
// tests, examples and benchmarks reuse (CMakeLists.txt, sac_use_torch_pch).
