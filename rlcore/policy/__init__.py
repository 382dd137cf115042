"""The policy: HFPolicy, the chunked sampler, its decoders, the weights they read and the
generation loop around it, devices, the model-directory check and the model builders (the
embedded tiny model, the Qwen2.5 stand-in)."""
