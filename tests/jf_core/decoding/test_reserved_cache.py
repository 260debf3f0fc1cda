"""The in-place KV cache holds exactly what transformers' concatenating one holds, through every operation the
decoders use (append, crop, row select, reassignment by KVState.compact), and appends without copying the cache."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from jf_core.decoding.reserved_cache import ReservedLayer, reserved_cache


def states(batch: int, slots: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, slots, 4, generator=g), torch.randn(batch, 2, slots, 4, generator=g)


def both(layers: tuple, op) -> None:
    for layer in layers:
        op(layer)


def same(reserved: ReservedLayer, dynamic: DynamicLayer) -> None:
    assert reserved.get_seq_length() == dynamic.get_seq_length()
    assert torch.equal(reserved.keys, dynamic.keys) and torch.equal(reserved.values, dynamic.values)


def test_it_holds_what_the_concatenating_cache_holds_through_the_decoders_operations():
    reserved, dynamic = ReservedLayer(), DynamicLayer()
    for seed, (batch, slots) in enumerate([(3, 7), (3, 5), (3, 1), (3, 16)]):  # a prefill, then windows
        k, v = states(batch, slots, seed)
        out = [layer.update(k, v) for layer in (reserved, dynamic)]
        assert all(torch.equal(a, b) for a, b in zip(out[0], out[1], strict=True))  # what attention sees
        same(reserved, dynamic)
        both((reserved, dynamic), lambda layer: layer.crop(-3))  # a window's rejected drafts
        same(reserved, dynamic)
    rows = torch.tensor([0, 2])  # a finished row dropped
    both((reserved, dynamic), lambda layer: layer.batch_select_indices(rows))
    same(reserved, dynamic)
    k, v = states(2, 4, 9)
    both((reserved, dynamic), lambda layer: layer.update(k, v))
    same(reserved, dynamic)

    def gathered(layer):  # as KVState.compact assigns gathered tensors: the keys first, then the values read
        index = torch.tensor([1, 0, 3])[None, None, :, None].expand(2, 2, 3, 4)
        layer.keys = torch.gather(layer.keys, 2, index)
        layer.values = torch.gather(layer.values, 2, index)

    both((reserved, dynamic), gathered)
    same(reserved, dynamic)
    k, v = states(2, 6, 10)
    both((reserved, dynamic), lambda layer: layer.update(k, v))
    same(reserved, dynamic)
    with pytest.raises(ValueError, match="negative count"):
        reserved.crop(2)


def test_appending_writes_into_the_room_instead_of_copying_the_cache():
    layer = ReservedLayer()
    layer.update(*states(1, 8, 0))
    buffers = {(layer._keys.shape[-2], layer._keys.data_ptr())}  # (room, where) of every buffer the layer held
    for seed in range(1, 121):  # 120 one-token steps, a crop every other one: 68 slots in the end
        layer.update(*states(1, 1, seed))
        if seed % 2:
            layer.crop(-1)
        buffers.add((layer._keys.shape[-2], layer._keys.data_ptr()))
    assert layer.get_seq_length() == 68
    # 8 slots of room at first, a quarter more (at least 16) as needed; each room one buffer, written in place
    assert sorted(room for room, _ in buffers) == [8, 24, 40, 56, 72]
    known = ReservedLayer(room=70)  # where the caller knows the final length: one buffer, no copy
    known.update(*states(1, 8, 0))
    first = known._keys.data_ptr()
    for seed in range(1, 61):
        known.update(*states(1, 1, seed))
    assert known.get_seq_length() == 68 and known._keys.data_ptr() == first and known._keys.shape[-2] == 70


def test_a_cache_from_a_config_keeps_transformers_sliding_layers(tiny_model):
    config = tiny_model.config
    cache = reserved_cache(config)
    assert cache.layers and all(isinstance(layer, ReservedLayer) for layer in cache.layers)  # the tiny model is full
    sliding = {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 0}
    config = type(config).from_dict({**config.to_dict(), **sliding, "layer_types": ["sliding_attention"] *
                                     config.num_hidden_layers})  # fmt: skip
    assert not any(isinstance(layer, ReservedLayer) for layer in reserved_cache(config).layers)
    lazy = reserved_cache(room=12)
    lazy.update(*states(1, 3, 0), layer_idx=1)
    assert [type(layer) for layer in lazy.layers] == [ReservedLayer, ReservedLayer]
    assert lazy.layers[1]._keys.shape[-2] == 12
