"""A step's host inputs go to the device in one copy (``to_device_packed``): laid end to end in
one staging buffer at 16-byte offsets and handed back as views. Staged on the CPU here, so the
layout the GPU gets is checked without one."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.engine.runner.device import to_device_packed


def test_packed_arrays_come_back_whole_as_aligned_views_of_one_buffer() -> None:
    tables = np.arange(15, dtype=np.int32).reshape(3, 5)
    arrays = [
        ([7, 8, 9], torch.int64),
        (np.array([3, 1], dtype=np.int64), torch.int32),  # narrowed, as the seq lens are
        ([], torch.int64),  # a step that samples nothing
        (tables, torch.int32),
        ([0.5, -2.0], torch.float32),
    ]
    out = to_device_packed(arrays, torch.device("cpu"), staged=True)
    assert [t.dtype for t in out] == [torch.int64, torch.int32, torch.int64, torch.int32,
                                      torch.float32]  # fmt: skip
    assert out[0].tolist() == [7, 8, 9] and out[1].tolist() == [3, 1] and out[2].numel() == 0
    assert torch.equal(out[3], torch.from_numpy(tables)) and out[4].tolist() == [0.5, -2.0]
    filled = [t for t in out if t.numel()]
    base = filled[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in filled)
    assert all((t.data_ptr() - base) % 16 == 0 for t in filled)


def test_unstaged_arrays_are_the_plain_copies() -> None:
    out = to_device_packed([([1, 2], torch.int64), ([4], torch.int32)], torch.device("cpu"))
    assert out[0].tolist() == [1, 2] and out[1].dtype == torch.int32
    assert out[0].untyped_storage().data_ptr() != out[1].untyped_storage().data_ptr()


def test_a_decode_only_step_samples_its_first_rows_without_a_gather(bundled_llm) -> None:  # noqa: ANN001
    """A prefill step samples each prompt's last row; a decode-only step samples every row in
    order, so the runner takes hidden's first rows as they are."""
    from kvserve.engine.core.sampling_params import SamplingParams
    from kvserve.engine.runner.input_batch import build_model_inputs

    core = bundled_llm.engine
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    core.add_request("p1", [1, 504, 3458, 282], params)
    core.add_request("p2", [1, 4649, 314], params)
    seen = []
    for _ in range(2):
        plan = core.scheduler.schedule()
        inputs = build_model_inputs(plan, core.runner.page_size, core.device)
        hidden = torch.arange(10.0).view(10, 1)
        picked = inputs.sampled(hidden).view(-1).tolist()
        seen.append((inputs.samples_every_row, picked))
        core.scheduler.update(plan, {c.request.request_id: 7 for c in plan.chunks if c.sample})
    assert seen == [(False, [3.0, 6.0]), (True, [0.0, 1.0])]
    for rid in ("p1", "p2"):
        core.abort_request(rid)
    while core.has_unfinished():
        core.step()
