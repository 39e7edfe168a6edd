"""Models for remat's tests and benchmarks, built the ways people write
them: `models` (an MLP, a GPT-style decoder, a ResNet, an LSTM, ... at
sizes a CPU runs in seconds), `zoo` (patterns users write: the optimizer's
step, accumulation, two backwards over one graph, ...), `zoo_tv`
(torchvision's classifiers) and `zoo_hf` (transformers' models). Not part
of remat's API: they may change between versions."""
