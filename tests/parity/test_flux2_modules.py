"""Flux2 components vs diffusers' modules on the same saved weights."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel

from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.loading.safetensors_io import load_weights
from vidloom.families.flux2.transformer import FLUX2_TRANSFORMER_NAME_MAP, Flux2Transformer, Flux2TransformerConfig
from vidloom.families.flux2.vae import FLUX2_VAE_NAME_MAP, Flux2VAE, Flux2VAEConfig, patchify

TOLERANCE = 1e-5  # the same fp32 products; a few fused roundings (ops.py) differ by ulps: observed <= 7e-7


def test_transformer_matches_with_per_sample_timesteps(tiny_flux2_dir):
    ckpt = DiffusersDir.open(tiny_flux2_dir)
    ref = Flux2Transformer2DModel.from_pretrained(str(ckpt.component_dir("transformer"))).eval()
    ours = Flux2Transformer(Flux2TransformerConfig.from_diffusers(ckpt.component_config("transformer")))
    load_weights(ours, ckpt.component_dir("transformer"), FLUX2_TRANSFORMER_NAME_MAP)
    g = torch.Generator().manual_seed(0)
    b, n, length = 2, 12, 7
    img = torch.randn(b, n, ref.config.in_channels, generator=g)
    txt = torch.randn(b, length, ref.config.joint_attention_dim, generator=g)
    t = torch.tensor([0.9, 0.2])  # different per sample: what cross-request batching relies on
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(3), torch.arange(4), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length))
    with torch.no_grad():
        expected = ref(hidden_states=img, encoder_hidden_states=txt, timestep=t, img_ids=ids[None].expand(b, -1, -1),
                       txt_ids=txt_ids[None].expand(b, -1, -1), return_dict=False)[0]
        got = ours(img, txt, t, ids, txt_ids)
    assert (got - expected).abs().max() <= TOLERANCE


def test_vae_encode_decode_match(tiny_flux2_dir):
    ckpt = DiffusersDir.open(tiny_flux2_dir)
    ref = AutoencoderKLFlux2.from_pretrained(str(ckpt.component_dir("vae"))).eval()
    ours = Flux2VAE(Flux2VAEConfig.from_diffusers(ckpt.component_config("vae")))
    load_weights(ours, ckpt.component_dir("vae"), FLUX2_VAE_NAME_MAP)
    mean = ref.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(ref.bn.running_var.view(1, -1, 1, 1) + ref.config.batch_norm_eps)
    x = torch.rand(1, 3, 32, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        expected = (patchify(ref.encode(x).latent_dist.mode()) - mean) / std
        assert (ours.encode(x) - expected).abs().max() <= TOLERANCE
        z = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
        from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

        expected_px = ref.decode(Flux2KleinPipeline._unpatchify_latents(z * std + mean)).sample
        assert (ours.decode(z) - expected_px).abs().max() <= TOLERANCE


def test_vae_tiled_decode_matches_diffusers_tiled_decode(tiny_flux2_dir):
    """`vae_tile` 32 (stride 24) is diffusers' tiling at tile_sample_min_size 32 and its overlap 0.25: same tiles,
    same blend. fp32, the same ops per tile: observed 0.0 (bound TOLERANCE); the untiled decode differs."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    from vidloom.layers.tiling import SpatialTiling

    ckpt = DiffusersDir.open(tiny_flux2_dir)
    ref = AutoencoderKLFlux2.from_pretrained(str(ckpt.component_dir("vae"))).eval()
    ours = Flux2VAE(Flux2VAEConfig.from_diffusers(ckpt.component_config("vae")))
    load_weights(ours, ckpt.component_dir("vae"), FLUX2_VAE_NAME_MAP)
    ref.enable_tiling()
    ref.tile_sample_min_size, ref.tile_latent_min_size = 32, 32 // ours.config.spatial_factor
    mean = ref.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(ref.bn.running_var.view(1, -1, 1, 1) + ref.config.batch_norm_eps)
    cell = 2 * ours.config.spatial_factor  # pixels per patchified latent cell
    z = torch.randn(1, 4 * ref.config.latent_channels, 96 // cell, 80 // cell, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = ref.decode(Flux2KleinPipeline._unpatchify_latents(z * std + mean)).sample
        got = ours.decode(z, SpatialTiling(tile=32, stride=24))
        untiled = ours.decode(z)
    assert got.shape == expected.shape == untiled.shape
    assert (got - expected).abs().max() <= TOLERANCE
    assert (got - untiled).abs().max() > 1e-3  # the seams really are blended tiles


@pytest.mark.parametrize("config", [
    # Guidance-embedded (Flux2 dev's layout), uneven rope axes, a fractional MLP ratio, another eps.
    dict(num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=3, in_channels=8,
         joint_attention_dim=20, timestep_guidance_channels=32, axes_dims_rope=(2, 6, 4, 4), mlp_ratio=2.5,
         eps=1e-5, guidance_embeds=True, rope_theta=10000),
    # No single blocks; out_channels apart from in_channels; one head.
    dict(num_layers=2, num_single_layers=0, attention_head_dim=8, num_attention_heads=1, in_channels=4,
         out_channels=6, joint_attention_dim=12, timestep_guidance_channels=16, axes_dims_rope=(2, 2, 2, 2),
         guidance_embeds=False),
])
def test_transformer_matches_on_other_valid_configs(tmp_path, config):
    torch.manual_seed(0)
    ref = Flux2Transformer2DModel(patch_size=1, **config).eval()
    ref.save_pretrained(str(tmp_path))
    ours = Flux2Transformer(Flux2TransformerConfig.from_diffusers(dict(ref.config)))
    load_weights(ours, tmp_path, FLUX2_TRANSFORMER_NAME_MAP)
    g = torch.Generator().manual_seed(0)
    b, length = 2, 5
    img = torch.randn(b, 6, config["in_channels"], generator=g)
    txt = torch.randn(b, length, config["joint_attention_dim"], generator=g)
    t, guidance = torch.tensor([0.7, 0.1]), torch.tensor([3.5, 1.0])
    ids = torch.cartesian_prod(torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length))
    use = guidance if config["guidance_embeds"] else None
    with torch.no_grad():
        expected = ref(hidden_states=img, encoder_hidden_states=txt, timestep=t, img_ids=ids, txt_ids=txt_ids,
                       guidance=use, return_dict=False)[0]
        got = ours(img, txt, t, ids, txt_ids, use)
    assert (got - expected).abs().max() <= TOLERANCE
