"""benchmarks/ is a package whose scripts import against this tree, and its shared helpers drive
an engine (a tiny Llama with dummy weights on the CPU) the way the GPU benchmarks do."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from benchmarks import admission_model, code_ab_worker, common
from benchmarks.code_ab import TINY_LLAMA, ratios, summary
from kvserve import LLM, SamplingParams
from kvserve.config import SchedulerConfig

SCRIPTS = sorted(p.stem for p in Path(common.__file__).parent.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_imports(name: str) -> None:
    try:
        module = importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as e:
        if e.name == "triton":
            pytest.skip("a GPU kernel benchmark; Triton is not installed")
        raise
    assert module.__doc__, "say what the benchmark measures"


def test_write_result_stamps_commit_from_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KVSERVE_COMMIT", "abc1234")
    # the switches the command line set, as read when the benchmark started
    monkeypatch.setattr(common, "_SETTINGS_AT_START", {"KVSERVE_FP8_MOE_GEMV": "1"})
    path = common.write_result("probe", {"figure": 1.5}, tmp_path)
    record = json.loads(path.read_text())
    assert record["kvserve_env_at_start"] == {"KVSERVE_FP8_MOE_GEMV": "1"}
    assert path.parent == tmp_path and path.name.startswith("probe_")
    assert record["commit"] == "abc1234" and record["benchmark"] == "probe"
    assert record["figure"] == 1.5 and "torch" in record["machine"] and record["date"]
    assert record["machine"]["triton"] == importlib.metadata.version("triton")  # make test has it
    assert common.write_result("probe", {"figure": 2.0}, tmp_path) == path  # the run saves again
    monkeypatch.setattr(common, "_RUN_PATHS", {})  # another run, the same day
    again = common.write_result("probe", {"figure": 2.5}, tmp_path)
    assert again.name == path.name.replace(".json", "_2.json")
    assert json.loads(path.read_text())["figure"] == 2.0  # the first run's file is kept
    assert json.loads(again.read_text())["figure"] == 2.5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(path)


def test_engine_helpers_drive_a_dummy_engine(tiny_dir: str) -> None:
    core = common.build_engine(tiny_dir, device="cpu", dtype="float32", max_running_requests=8)
    rate = common.decode_rate(core, 2, 32, 2, 6)
    assert rate["tok_s"] > 0 and rate["step_ms"] > 0 and not core.has_unfinished()
    assert common.kv_bytes_per_token(core) == 2 * 2 * 2 * 16 * 4  # K+V, layers, kv heads, D, fp32
    assert common.weight_bytes(core) > 4 * common.matmul_params(core) > 0
    table = TINY_LLAMA["vocab_size"] * TINY_LLAMA["hidden_size"]  # embedding, untied; the head
    assert common.step_weight_bytes(core) == common.weight_bytes(core) - 4 * table  # fp32
    # a 9-token prompt: 9 tokens through the layers, the head for the last one, causal attention
    attn = 4 * 2 * 4 * 16 * 9 * 10 / 2  # layers, heads, head_dim, 9 rows over 1..9 keys
    layers = common.matmul_params(core) - table
    assert common.prefill_flops(core, 9) == 2 * layers * 9 + 2 * table + attn
    assert common.kv_capacity_tokens(core) == common.kv_pages(core) * 16
    assert common.decode_graphs(core) is None and common.max_running_requests(core) == 8
    common.add_decode_batch(core, 3, 16, 5, seed=1, min_outputs=2)
    assert common.drain(core) > 0 and common.preemptions(core) == 0
    core.check_integrity()


def test_long_context_parts_drive_a_dummy_engine(tiny_dir: str) -> None:
    """The 32 x 32K run and the whole-prompt prefill at toy sizes, on the CPU: each returns its
    figures with floors counted from the same engine (a wrong call fails here, not on a GPU)."""
    from benchmarks import long_context

    core = common.build_engine(tiny_dir, device="cpu", dtype="float32", max_running_requests=8)
    chosen = {"attention_backend": "torch", "prefill_attention": "torch", "pdl": False}
    assert common.engine_choices(core) == chosen  # a CPU engine: the torch reference
    assert common.stamp("probe")["engines_built"][-1] == chosen  # every result records it
    ceil = {"copy_GBps": 100.0, "bf16_matmul_TFLOPs": 1.0}
    run = long_context.run_32k(core, ceil, 3, 40, 6)
    assert run["requests"] == 3 and run["preemptions_total"] == 0 and not core.has_unfinished()
    assert 0 < run["all_first_token_s"] <= run["wall_s"] and run["decode_steps"] > 0
    assert run["floor_s"] == run["prefill_floor_s"] + run["decode_kv_floor_s"] > 0
    rows = long_context.run_whole_prompts(core, ceil, [24, 48])
    assert [r["prompt"] for r in rows] == [24, 48]
    for row in rows:
        assert row["s"] > 0 and row["floor_s"] == common.prefill_flops(core, row["prompt"]) / 1e12
    core.check_integrity()


def test_the_offline_floor_counts_the_decode_steps_the_kv_pool_allows(tiny_dir: str) -> None:
    """A running cap larger than the pool can hold at full length must not shorten the floor:
    its decode steps are at least the requests' context-token-steps over the pool's tokens."""
    from benchmarks import roofline

    core = common.build_engine(tiny_dir, device="cpu", dtype="float32", max_running_requests=8)
    pool = common.kv_capacity_tokens(core)
    assert roofline.decode_steps_floor(core, 16, 4, 8) == 2 * 8  # two waves of 8, pool ample
    in_len = pool // 4  # four prompts fill the pool: the cap of 8 cannot run at once
    steps = roofline.decode_steps_floor(core, 16, in_len, 8)
    assert steps == -(-16 * (8 * in_len + 28) // pool) > 2 * 8
    ceil = {"copy_GBps": 100.0, "bf16_matmul_TFLOPs": 1.0}
    floor = roofline.offline_floor(core, ceil, 16, in_len, 8)
    assert floor["floor_decode_steps"] == steps
    per_step = common.step_weight_bytes(core) / 100e9
    assert floor["floor_parts_s"]["decode_weight_read"] == pytest.approx(steps * per_step)


def test_a_tied_head_reads_the_whole_embedding_each_step(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "tie_word_embeddings": True}))
    core = common.build_engine(str(tmp_path), device="cpu", dtype="float32")
    assert common.step_weight_bytes(core) == common.weight_bytes(core)
    norms = sum(p.numel() for name, p in common.model_parameters(core) if "norm" in name)
    # the table is the head: every weight but the norms' multiplies
    assert (common.matmul_params(core) + norms) * 4 == common.weight_bytes(core)


@pytest.mark.parametrize("quantization", ["nvfp4", "fp8"])
def test_matmul_flops_count_values_not_bytes_of_quantized_weights(
    tiny_dir: str, quantization: str
) -> None:
    """An FP4 byte holds two weights and FP8 weights carry scales: the FLOP floors of prefill
    must not change with the storage (they did for FP4, halving its prefill floor)."""
    plain = common.build_engine(tiny_dir, device="cpu", dtype="float32")
    quantized = common.build_engine(
        tiny_dir, device="cpu", dtype="float32", quantization=quantization
    )
    assert common.matmul_params(quantized) == common.matmul_params(plain)
    assert common.weight_bytes(quantized) < common.weight_bytes(plain)


def test_code_ab_worker_measures_with_the_public_api(tiny_dir: str) -> None:
    llm = LLM(tiny_dir, load_format="dummy", device="cpu", max_running_requests=4)
    rate = code_ab_worker.decode_rate(llm.engine, SamplingParams, 2, 32, 2, 6)
    assert rate["tok_s"] > 0 and code_ab_worker.reset_prefix_cache(llm.engine)
    off = code_ab_worker.offline(llm.engine, SamplingParams, 3, 16, 4)
    assert off["output_tok_s"] > 0 and off["requests"] == 3
    side = {"decode": {"1": rate}, "offline": off}
    other = {"decode": {"1": {**rate, "tok_s": rate["tok_s"] * 2}}, "offline": off}
    assert ratios(side, other) == {"decode_b1_tok_s": 2.0, "offline_output_tok_s": 1.0}
    rounds = [{"base": side, "head": other, "ratio_head_over_base": ratios(side, other)}]
    assert summary(rounds)["decode_b1_tok_s"]["ratio_mean"] == 2.0


def test_lowbit_sass_counts_the_longest_loop() -> None:
    """The SASS counter behind the kernels' instructions-a-weight figures, on cuobjdump's
    layout: the prologue, a forward branch, a shorter loop before (the FP8 half sums' pass over
    x) and the epilogue are left out."""
    from benchmarks.lowbit_sass import loop_opcodes

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;  /* 0x00000a0000017a02 */
        /*0010*/                   FMNMX R3, R3, R1, !PT ;
        /*0020*/              @!P3 BRA 0x10 ;
        /*0030*/               @P2 BRA 0x80 ;              /* 0x0000004000002947 */
        /*0040*/                   LOP3.LUT R2, R1, 0x7, RZ, 0xc0, !PT ;
        /*0050*/               @P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0060*/                   HFMA2 R6, R4, R5, R6 ;
        /*0070*/              @!P1 BRA 0x40 ;
        /*0080*/                   EXIT ;
    """
    assert loop_opcodes(sass) == {"LOP3": 1, "LDG": 1, "HFMA2": 1, "BRA": 1}
    with pytest.raises(ValueError, match="no backward branch"):
        loop_opcodes("        /*0000*/                   EXIT ;")


@pytest.mark.parametrize("rows", [16, 32, 64])
@pytest.mark.parametrize("words", [False, True], ids=["bytes", "words"])
@pytest.mark.parametrize("group", [16, 32], ids=["nvfp4", "mxfp4"])
def test_fp4_kernels_compile_for_sm90_with_either_dequant(
    group: int, words: bool, rows: int
) -> None:
    """ptxas, not the interpreter, is what rejects a kernel's Triton (the interpreter runs its
    Python): the FP4 MMA kernel compiles for sm_90 with W as bytes and as words, as either MMA
    operand up to 32 rows (A on wgmma, B on mma.sync), and the MoE grouped kernel and the
    dequantizing kernel of large steps with bytes and words, on any machine with Triton
    installed."""
    pytest.importorskip("triton")
    from dataclasses import replace

    from benchmarks.lowbit_sass import K, N, compile_dequantize, compile_mma, compile_moe
    from kvserve.kernels.fp4_gemm import default_config

    cfg = replace(default_config(rows, N, K, group=group), word_dequant=words)
    for w_as_b in (False, True) if rows <= 32 else (False,):
        assert compile_mma(replace(cfg, w_as_b=w_as_b), group)[:4] == b"\x7fELF"
    assert compile_moe(group, words)[:4] == b"\x7fELF"
    assert compile_dequantize(group, words)[:4] == b"\x7fELF"


def test_fp4_planes_layout_holds_its_codes_and_its_sm90_loop_reloads_no_tile() -> None:
    """benchmarks/fp4_planes.py: its K-plane words hold the codes they are said to, and its
    kernel's sm_90 K loop keeps the decoded planes in registers (no STS / LDSM, 2 barriers a
    step), the property its GPU timing was to weigh."""
    pytest.importorskip("triton")
    from benchmarks.fp4_planes import TILES, check_layout, sass_summaries

    check_layout()
    (loop,) = sass_summaries(tiles=TILES[:1], groups=(32,))
    ops = loop["loop_opcodes"]
    assert loop["STACK"] == 0 and "STS" not in ops and "LDSM" not in ops
    assert ops["BAR"] <= 2 and ops["HGMMA"] == 8


def test_matmul_params_of_a_moe_count_the_routers_and_top_k_experts(tiny_model_dir) -> None:
    """A token multiplies by its top-k experts, not by all of them: from the parameters, every
    weight but the embedding table, the norms and each sparse layer's unchosen experts."""
    from model_factory import MOE_TINY

    tiny = MOE_TINY["Qwen3MoeForCausalLM"]
    path = str(tiny_model_dir("Qwen3MoeForCausalLM", **tiny))
    core = common.build_engine(path, device="cpu", dtype="float32")
    params = dict(common.model_parameters(core))
    kept = sum(p.numel() for name, p in params.items() if "norm" not in name)
    embedding = core.runner.model.model.embed_tokens.weight.numel()
    hidden = core.model_config.hidden_size
    expert = 3 * hidden * tiny["moe_intermediate_size"]
    unchosen = (tiny["num_experts"] - tiny["num_experts_per_tok"]) * expert  # one sparse layer
    assert common.matmul_params(core) == kept - embedding - unchosen


def test_moe_gemm_reads_each_configs_expert_shape() -> None:
    """The grouped-GEMM benchmark's shapes come from the bundled configs, per family's names."""
    pytest.importorskip("triton")
    from benchmarks.moe_gemm import moe_shape

    qwen = {"experts": 128, "top_k": 8, "hidden": 2048, "inter": 768, "shared": 0}
    assert moe_shape("qwen3-30b-a3b") == qwen
    glm = {"experts": 128, "top_k": 8, "hidden": 4096, "inter": 1408, "shared": 1}
    assert moe_shape("glm-4.5-air") == glm


def test_moe_benchmarks_route_a_stacked_shared_expert_as_the_engine_does() -> None:
    """GLM-4.5-Air's shared expert is stacked as expert 128: the tuner's steps carry its slot
    (k + 1 a token, weight 1.0, last) over 129 experts, keyed by the routed shape."""
    pytest.importorskip("triton")
    import torch

    from benchmarks.moe_gemm import Routed, moe_shape, stacked
    from benchmarks.moe_tune_space import shape_key

    glm, qwen = moe_shape("glm-4.5-air"), moe_shape("qwen3-30b-a3b")
    assert stacked(glm) == (9, 129) and stacked(qwen) == (8, 128)
    r = Routed(glm, 3, device="cpu")
    assert (r.top_k, r.experts, r.slots) == (9, 129, 27) and r.ids.shape == (3, 9)
    assert (r.ids[:, 8] == 128).all() and (r.ids[:, :8] < 128).all()
    assert torch.equal(r.weights[:, 8], torch.ones(3))
    torch.testing.assert_close(r.weights[:, :8].sum(-1), torch.ones(3))
    assert shape_key("nvfp4", glm).key() == "nvfp4 E=128 N=2816 K=4096 top_k=8"


def test_lowbit_decode_formats_keep_the_engines_kernels_unless_a_suffix_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain format measures the engine's defaults (or what the environment set, as env_ab
    does); ``+w8a8`` / ``+w8a16`` / ``+cublas`` set the FP8 kernel choices for that format only."""
    from benchmarks import lowbit_decode as lb
    from kvserve.quant.fp8_method import (
        SKINNY_ROWS_ENV,
        W8A16_ROWS_ENV,
        skinny_max_rows,
        w8a16_max_rows,
    )

    for var in (W8A16_ROWS_ENV, SKINNY_ROWS_ENV):
        monkeypatch.delenv(var, raising=False)  # put back after the test
    monkeypatch.setattr(lb, "_STARTING_ENV", {W8A16_ROWS_ENV: None, SKINNY_ROWS_ENV: "16"})
    try:
        lb.apply_kernel_settings([], 1, None)
        assert (w8a16_max_rows(), skinny_max_rows()) == (1, 16)  # the default GEMV row; env's
        lb.apply_kernel_settings(["w8a8", "kv8"], 1, None)
        assert (w8a16_max_rows(), skinny_max_rows()) == (0, 16)
        lb.apply_kernel_settings(["w8a16", "cublas"], 2, None)
        assert (w8a16_max_rows(), skinny_max_rows()) == (2, 0)
        lb.apply_kernel_settings([], 1, 32)
        assert (w8a16_max_rows(), skinny_max_rows()) == (1, 32)
        assert lb.known_format("fp8+w8a8") and not lb.known_format("fp8+w4a16")
    finally:  # the readers cache: the next reads the environment the test leaves
        w8a16_max_rows.cache_clear()
        skinny_max_rows.cache_clear()


def test_moe_decode_takes_a_kv8_suffix_and_nothing_else() -> None:
    """GLM-4.5-Air's FP8 weights leave room for batch 64 at 1K context in bf16 KV; ``+kv8``
    measures larger batches. The dense-FP8 kernel suffixes do not apply to expert stacks."""
    from benchmarks.lowbit_decode import format_settings, known_format, parse_formats
    from benchmarks.moe_decode import SUFFIXES

    assert known_format("fp8-block", SUFFIXES) and known_format("fp8-block+kv8", SUFFIXES)
    assert not known_format("fp8-block+cublas", SUFFIXES) and not known_format("fp9+kv8", SUFFIXES)
    assert format_settings("nvfp4", ["kv8"]) == {
        "quantization": "nvfp4",
        "kv_cache_dtype": "fp8_e4m3",
    }
    assert format_settings("fp8-block", []) == {}  # its checkpoint config says FP8
    assert parse_formats("fp8-block,nvfp4+kv8", SUFFIXES) == ["fp8-block", "nvfp4+kv8"]
    with pytest.raises(SystemExit, match=r"\['fp8-block\+cublas'\]; known: .*, each \+kv8$"):
        parse_formats("fp8-block+cublas", SUFFIXES)


def test_env_ab_alternates_the_sides_in_fresh_processes(tmp_path: Path) -> None:
    """``env_ab`` runs a benchmark command once per side and round with that side's settings,
    alternating, keeps every run's file, and summarizes the rates each file holds."""
    from benchmarks import env_ab

    bench = tmp_path / "bench.py"
    bench.write_text(
        "import argparse, json, os, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from benchmarks.common import write_result\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('root'); ap.add_argument('--out-dir')\n"
        "ap.add_argument('--tag'); a = ap.parse_args()\n"
        "gated = os.environ.get('KVSERVE_GATED_GEMV', '1') == '1'\n"
        "rows = [{'batch': 1, 'tok_s': 110.0 if gated else 100.0}, {'batch': 64, 'tok_s': 9.0}]\n"
        "write_result(f'fake_{a.tag}', {'rows': rows, 'offline': {'output_tok_s': 5.0}},"
        " a.out_dir)\n"
    )
    root = str(Path(__file__).parents[1])
    out = tmp_path / "out"
    sides = ["--side", "plain:KVSERVE_GATED_GEMV=0", "--side", "gated:", "--rounds", "2"]
    command = ["--", sys.executable, str(bench), root]
    env_ab.main([*sides, "--tag", "t", "--out-dir", str(out), *command])
    names = sorted(p.name for p in out.glob("fake_*.json"))
    assert [n.split("_2")[0] for n in names] == ["fake_t_gated1", "fake_t_gated2",
                                                 "fake_t_plain1", "fake_t_plain2"]  # fmt: skip
    (result,) = out.glob("env_ab_t_*.json")
    summary = json.loads(result.read_text())["summary"]
    assert summary["plain"]["decode_b1"]["values"] == [100.0, 100.0]
    assert summary["gated"]["decode_b1"]["ratio_to_first"] == 1.1
    assert summary["gated"]["offline"]["median"] == 5.0
    per_format = {"formats": {"fp8": {"decode": [{"batch": 64, "tok_s": 2.0}]},
                              "fp8-block": {"decode": [{"batch": 64, "tok_s": 3.0}]}}}  # fmt: skip
    assert env_ab.rates_of(per_format) == {"fp8_decode_b64": 2.0, "fp8-block_decode_b64": 3.0}
    assert env_ab.run_order(["a", "b"], 3) == [("a", 1), ("b", 1), ("b", 2), ("a", 2),
                                               ("a", 3), ("b", 3)]  # fmt: skip
    with pytest.raises(ValueError, match="KVSERVE_NAME=value"):
        env_ab.parse_side("x:PATH=/bin")
    with pytest.raises(ValueError, match="KVSERVE_GATED_GEMM is not a kvserve setting"):
        env_ab.parse_side("x:KVSERVE_GATED_GEMM=1")


def test_env_ab_runs_a_side_on_another_source_tree(tmp_path: Path) -> None:
    """A ``name@TREE`` side runs the command in TREE with TREE's kvserve first on the path and
    its results stamped as that tree's; the other side runs this checkout's kvserve."""
    from benchmarks import env_ab

    old = tmp_path / "ab_old"
    (old / "kvserve").mkdir(parents=True)
    (old / "kvserve" / "__init__.py").write_text("OLD = True\n")
    bench = tmp_path / "bench.py"
    bench.write_text(
        "import argparse, json, os, pathlib, kvserve\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('--out-dir'); ap.add_argument('--tag')\n"
        "a = ap.parse_args()\n"
        "rate = 100.0 if getattr(kvserve, 'OLD', False) else 120.0\n"
        "record = {'cwd': os.getcwd(), 'commit': os.environ.get('KVSERVE_COMMIT'),\n"
        "          'prefill': [{'prompt_len': 1024, 'tok_s': 2 * rate}]}\n"
        "path = pathlib.Path(a.out_dir) / f'fake_{a.tag}.json'\n"
        "path.write_text(json.dumps(record))\n"
    )
    out = tmp_path / "out"
    sides = ["--side", f"old@{old}:", "--side", "new:", "--rounds", "1"]
    env_ab.main([*sides, "--tag", "t", "--out-dir", str(out), "--", sys.executable, str(bench)])
    (result,) = out.glob("env_ab_t_*.json")
    record = json.loads(result.read_text())
    assert record["summary"]["new"]["prefill_1024"]["ratio_to_first"] == 1.2
    assert record["trees"] == {"old": str(old.resolve())}
    old_run = json.loads((out / "fake_t_old1.json").read_text())
    assert old_run["cwd"] == str(old.resolve()) and old_run["commit"] == "tree:ab_old"
    with pytest.raises(ValueError, match="is not a kvserve source tree"):
        env_ab.parse_side(f"x@{tmp_path}:")


def test_the_admission_model_preempts_less_with_room_kept() -> None:
    # 40 requests of 64 prompt tokens that each grow by 300 in a 4,096-token pool: admitted on
    # known tokens alone they overrun it; with room kept for expected output far less so.
    costs = admission_model.Costs(4096, 1e-3, 1e-8, 1e-5)
    work = [([i + 1] * 64, 400, 300) for i in range(40)]
    rows = [
        admission_model.simulate(costs, SchedulerConfig(schedule_conservativeness=c), work)
        for c in (0.0, 1.0)
    ]
    assert rows[0]["preemptions"] > 2 * rows[1]["preemptions"]
    assert rows[0]["recomputed_share"] > rows[1]["recomputed_share"] >= 0
    assert all(r["max_running"] == 256 and r["model_s"] > 0 for r in rows)


def test_exposed_times_split_a_profiled_step_into_streams_and_chains() -> None:
    """A kernel's exposed time is how far its end lies past every earlier kernel's; with the
    gaps, they sum to the window. On s67's profile of a Qwen3-30B-A3B batch-1 step (an H100,
    PDL on), the router ran about 8 us a layer but held the step for about 6: it launched
    early and waited on o_proj."""
    from benchmarks.decode_profile import exposed_times

    assert exposed_times([("a", 0, 10), ("b", 2, 12), ("a", 4, 6), ("c", 15, 20)]) == (
        {"a": 10.0, "b": 2.0, "c": 5.0},
        3.0,
    )
    name = "decode_profile_s67_q3_b1_fused_h100_2026-12-06.json"
    row = json.loads((common.RESULTS_DIR / name).read_text())["rows"][0]
    spans = [(kernel, start, start + took) for kernel, start, took in row["timeline_us"]]
    exposed, gaps = exposed_times(spans)
    window = max(end for *_, end in spans) - min(start for _, start, _ in spans)
    assert sum(exposed.values()) + gaps == pytest.approx(window)
    routers = [end - start for kernel, start, end in spans if kernel == "_normed_router_kernel"]
    assert sum(routers) / len(routers) > 7.5
    assert 5.5 < exposed["_normed_router_kernel"] / len(routers) < 6.5
