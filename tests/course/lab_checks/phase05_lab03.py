"""Phase 05, lab 03 (CUDAGraphMode, the downgrade, the dispatcher, piecewise graphs):
the mistakes its tests must catch, and the reference functions each step asks for."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODES = "mini_vllm.config.compilation"
DISPATCHER = "mini_vllm.engine.cudagraph_dispatcher"
SIMULATOR = "mini_vllm.teaching.cudagraph"

STEPS = {
    1: [
        f"{MODES}:CUDAGraphMode.separate_routine",
        f"{MODES}:CUDAGraphMode.decode_mode",
        f"{MODES}:CUDAGraphMode.mixed_mode",
        f"{MODES}:CUDAGraphMode.has_mode",
        f"{MODES}:CUDAGraphMode.requires_piecewise_compilation",
        f"{MODES}:CUDAGraphMode.max_cudagraph_mode",
        f"{MODES}:CUDAGraphMode.has_full_cudagraphs",
        f"{MODES}:CUDAGraphMode.valid_runtime_modes",
    ],
    2: [f"{MODES}:resolve_cudagraph_mode"],
    3: [f"{DISPATCHER}:CudagraphDispatcher.__init__"],
    4: [f"{DISPATCHER}:CudagraphDispatcher.dispatch"],
    5: [f"{SIMULATOR}:split_ops"],
    6: [
        f"{SIMULATOR}:PiecewiseGraphRunner.__init__",
        f"{SIMULATOR}:PiecewiseGraphRunner.close_capture_window",
        f"{SIMULATOR}:PiecewiseGraphRunner.__call__",
    ],
}

MUTANTS = [
    Mutant(
        name="decode and mixed swapped",
        mistake="decode_mode() reads element 1 of the pair, the mixed mode, instead of element 0",
        module=MODES,
        old="return CUDAGraphMode(self.value[0]) if self.separate_routine() else self",
        new="return CUDAGraphMode(self.value[1]) if self.separate_routine() else self",
    ),
    Mutant(
        name="has_mode blind to pairs",
        mistake="has_mode() compares the member itself with the mode, so it never looks "
        "inside a pair",
        module=MODES,
        old="return mode.value in self.value",
        new="return self is mode",
    ),
    Mutant(
        name="full graphs only for FULL",
        mistake="has_full_cudagraphs() is true for FULL alone, forgetting the pairs whose "
        "decode mode is FULL",
        module=MODES,
        old="return self.max_cudagraph_mode() is CUDAGraphMode.FULL",
        new="return self is CUDAGraphMode.FULL",
    ),
    Mutant(
        name="downgrade ignores the split",
        mistake="a backend that cannot run mixed batches in a full graph always gets "
        "FULL_AND_PIECEWISE, even when attention is not split (no pieces to capture)",
        module=MODES,
        old="CUDAGraphMode.FULL_AND_PIECEWISE\n            if attention_is_split\n"
        "            else CUDAGraphMode.FULL_DECODE_ONLY",
        new="CUDAGraphMode.FULL_AND_PIECEWISE",
    ),
    Mutant(
        name="NEVER backend downgraded silently",
        mistake="FULL asked of a NEVER backend is quietly downgraded instead of refused",
        module=MODES,
        old="if attn_support is AttentionCGSupport.NEVER:\n            raise UserError(",
        new="if attn_support is AttentionCGSupport.NEVER and False:\n            raise UserError(",
    ),
    Mutant(
        name="query length ignored",
        mistake="uniform decode loses FULL on any backend below UNIFORM_BATCH, even with one "
        "token a request, where UNIFORM_SINGLE_TOKEN_DECODE is enough",
        module=MODES,
        old="        and uniform_decode_query_len > 1\n",
        new="",
    ),
    Mutant(
        name="uniform keys unbounded",
        mistake="FULL uniform keys are built for every capture size, even those above "
        "max_num_seqs requests (a uniform batch that can never exist)",
        module=DISPATCHER,
        old="if q <= size <= max_num_seqs * q:",
        new="if q <= size:",
    ),
    Mutant(
        name="mixed keys always piecewise",
        mistake="the relaxed keys go under PIECEWISE whatever the mixed mode is, so FULL "
        "alone captures no graph",
        module=DISPATCHER,
        old="self.keys[self.mode.mixed_mode()].add(BatchDescriptor(size))",
        new="self.keys[CUDAGraphMode.PIECEWISE].add(BatchDescriptor(size))",
    ),
    Mutant(
        name="disable_full skips only the exact key",
        mistake="disable_full skips the exact FULL key but still tries the relaxed FULL key",
        module=DISPATCHER,
        old="            if relaxed in self.keys[CUDAGraphMode.FULL]:\n"
        "                return CUDAGraphMode.FULL, relaxed",
        new="        if relaxed in self.keys[CUDAGraphMode.FULL]:\n"
        "            return CUDAGraphMode.FULL, relaxed",
    ),
    Mutant(
        name="final NONE padded",
        mistake="when no key matches, dispatch returns NONE with the padded descriptor, so "
        "the eager forward runs padding rows nobody needs",
        module=DISPATCHER,
        old="return CUDAGraphMode.PIECEWISE, relaxed\n        return CUDAGraphMode.NONE, unpadded",
        new="return CUDAGraphMode.PIECEWISE, relaxed\n        return CUDAGraphMode.NONE, exact",
    ),
    Mutant(
        name="split drops the trailing run",
        mistake="split_ops emits a run of ops only when a splitting op ends it, so the ops "
        "after the last attention are lost",
        module=SIMULATOR,
        old="    if run:\n        pieces.append(Piece(tuple(run), is_splitting_op=False))\n"
        "    return pieces",
        new="    return pieces",
    ),
    Mutant(
        name="split makes empty pieces",
        mistake="split_ops closes the current run at every splitting op even when it is "
        "empty, making empty captured pieces",
        module=SIMULATOR,
        old="            if run:\n                pieces.append(Piece(tuple(run), "
        "is_splitting_op=False))\n                run = []",
        new="            pieces.append(Piece(tuple(run), is_splitting_op=False))\n"
        "            run = []",
    ),
    Mutant(
        name="window closed on the first piece only",
        mistake="close_capture_window closes the first captured piece's window and stops, "
        "so later pieces go on capturing new shapes",
        module=SIMULATOR,
        old="            if runner is not None:\n                runner.close_capture_window()",
        new="            if runner is not None:\n                runner.close_capture_window()\n"
        "                break",
    ),
    Mutant(
        name="fallback on the first piece only",
        mistake="only the first piece falls back to eager after the window closes; the "
        "others raise or capture",
        module=SIMULATOR,
        old="piece.ops, self.device, dtype=None, fallback_to_eager=fallback_to_eager",
        new="piece.ops, self.device, dtype=None, "
        "fallback_to_eager=fallback_to_eager and piece is self.pieces[0]",
    ),
    Mutant(
        name="fallback not passed on",
        mistake="the pieces' runners are built without fallback_to_eager, so a closed window "
        "raises even when the model asked to fall back",
        module=SIMULATOR,
        old="piece.ops, self.device, dtype=None, fallback_to_eager=fallback_to_eager",
        new="piece.ops, self.device, dtype=None",
    ),
    Mutant(
        name="every piece fed the model input",
        mistake="each piece is given the model's input instead of the previous piece's output",
        module=SIMULATOR,
        old="x = run_eager(piece.ops, self.device, x) if runner is None else runner(x)\n"
        "        return x",
        new="y = run_eager(piece.ops, self.device, x) if runner is None else runner(x)\n"
        "        return y",
    ),
]

MUTANTS += [
    Mutant(
        name="piecewise compilation only for PIECEWISE",
        mistake="requires_piecewise_compilation() is true for PIECEWISE alone, so "
        "FULL_AND_PIECEWISE, vLLM's default, would run its mixed batches without pieces",
        module=MODES,
        old="return self.has_mode(CUDAGraphMode.PIECEWISE)",
        new="return self is CUDAGraphMode.PIECEWISE",
    ),
    Mutant(
        name="NONE not a runtime mode",
        mistake="valid_runtime_modes() leaves NONE out as 'not a graph mode', though an eager "
        "forward runs under the runtime mode NONE",
        module=MODES,
        old="return self in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)",
        new="return self in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)",
    ),
    Mutant(
        name="a backend exactly at UNIFORM_BATCH refused",
        mistake="with speculative decoding, uniform decode keeps FULL only on a backend above "
        "UNIFORM_BATCH (<= instead of <), so a backend that meets the need exactly loses it",
        module=MODES,
        old="and attn_support < AttentionCGSupport.UNIFORM_BATCH",
        new="and attn_support <= AttentionCGSupport.UNIFORM_BATCH",
    ),
    Mutant(
        name="FULL_AND_PIECEWISE keeps its pieces without a split",
        mistake="without the split only a request for PIECEWISE is changed; FULL_AND_PIECEWISE "
        "keeps a PIECEWISE half that has no pieces to capture",
        module=MODES,
        old="        elif mode is CUDAGraphMode.FULL_AND_PIECEWISE:\n"
        "            mode = CUDAGraphMode.FULL\n",
        new="",
    ),
    Mutant(
        name="FULL alone gets uniform keys",
        mistake="uniform FULL keys are built whenever decode runs FULL, for FULL alone too, "
        "which serves decode through its relaxed keys and routes nothing apart",
        module=DISPATCHER,
        old="if self.mode.decode_mode() is CUDAGraphMode.FULL and self.mode.separate_routine():",
        new="if self.mode.decode_mode() is CUDAGraphMode.FULL:",
    ),
    Mutant(
        name="uniform keys count tokens as requests",
        mistake="a uniform key's request count is its token count, wrong as soon as a "
        "request computes several tokens (speculative decoding)",
        module=DISPATCHER,
        old="BatchDescriptor(size, size // q, uniform=True)",
        new="BatchDescriptor(size, size, uniform=True)",
    ),
    Mutant(
        name="the top rung runs eagerly",
        mistake="dispatch sends a batch of exactly the largest capture size to NONE (>= "
        "instead of >), so the largest graph is captured and never replayed",
        module=DISPATCHER,
        old="num_tokens > self.max_capture_size",
        new="num_tokens >= self.max_capture_size",
    ),
    Mutant(
        name="the padded key keeps the batch's request count",
        mistake="a uniform batch is padded to its rung's token count but keeps its own "
        "request count, so its key BD(40, 33, True) matches no graph",
        module=DISPATCHER,
        old="exact = BatchDescriptor(rung, rung // q if uniform_decode else None, "
        "uniform=uniform_decode)",
        new="exact = BatchDescriptor(rung, num_tokens // q if uniform_decode else None, "
        "uniform=uniform_decode)",
    ),
    Mutant(
        name="uniform batch kept off the piecewise graphs",
        mistake="under FULL_AND_PIECEWISE a uniform batch only looks for a FULL key, so one "
        "past the uniform keys (more requests than max_num_seqs graphs cover) runs eagerly "
        "though a PIECEWISE graph of its size exists",
        module=DISPATCHER,
        old="        if relaxed in self.keys[CUDAGraphMode.PIECEWISE]:\n",
        new="        if relaxed in self.keys[CUDAGraphMode.PIECEWISE] and (\n"
        "            disable_full or not (uniform_decode and self.mode.separate_routine())\n"
        "        ):\n",
    ),
    Mutant(
        name="split on capturable, not on the predicate",
        mistake="split_ops cuts at the ops that are not capturable and ignores the "
        "is_splitting_op it was given",
        module=SIMULATOR,
        old="        if is_splitting_op(op):",
        new="        if not op.capturable:",
    ),
    Mutant(
        name="every piece checks the model's dtype",
        mistake="each piece's runner is built with the model's dtype, so a piece whose input "
        "another piece cast (float16 after a float32 one) is refused",
        module=SIMULATOR,
        old="piece.ops, self.device, dtype=None, fallback_to_eager=fallback_to_eager",
        new="piece.ops, self.device, dtype=self.dtype, fallback_to_eager=fallback_to_eager",
    ),
    Mutant(
        name="the model's input unchecked",
        mistake="the piecewise runner leaves every check to the pieces, whose runners accept "
        "any dtype, so a float64 input is run instead of refused",
        module=SIMULATOR,
        old="        _check_array(x, self.dtype)\n        for piece, runner",
        new="        for piece, runner",
    ),
]
