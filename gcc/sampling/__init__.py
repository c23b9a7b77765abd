"""Sampling a gc25d DiT, shared by gcc-sample and the samples logged during training: the sampler, the Wan
VAE, the decoders of sampled latents, video metrics and the files written (mp4, PNG contact sheets, GIFs)."""
