"""Phase 05, lab 01 (graph replay simulator): its steps and the mistakes its tests must catch."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

M = "mini_vllm.teaching.cudagraph"

STEPS = {
    1: [f"{M}:SimDevice.launch"],
    2: [f"{M}:SimDevice.replay"],
    3: [f"{M}:GraphRunner._check_input", f"{M}:GraphRunner._capture", f"{M}:GraphRunner.__call__"],
}

MUTANTS = [
    Mutant(
        name="capture launches the kernel",
        mistake="While capturing, launch() still charges a kernel launch, so capture "
        "looks like an eager run on the counters and the clock.",
        module=M,
        old="""        # Capture records and does not compute.""",
        new="""        self._issue("kernel", op.name, self.launch_us, op.gpu_us)
        # Capture records and does not compute.""",
    ),
    Mutant(
        name="captured output not from the pool",
        mistake="The captured op's output is a plain new array rather than a buffer of the "
        "graph pool, so the graph's memory is not accounted where it lives.",
        module=M,
        old="out = self.pool.allocate(probe.shape, probe.dtype)",
        new="out = np.empty_like(probe)",
    ),
    Mutant(
        name="node records a copy of its input",
        mistake="The recorded node keeps a copy of the input it saw at capture instead of "
        "the buffer itself, so every replay computes on the capture-time data.",
        module=M,
        old="graph.nodes.append(Node(op, x, out))",
        new="graph.nodes.append(Node(op, x.copy(), out))",
    ),
    Mutant(
        name="copy from host accepted in capture",
        mistake="A synchronous copy of host data to the device (torch.tensor(list, "
        "device='cuda')) is recorded like any kernel instead of being refused.",
        module=M,
        old="        if op.copies_from_host:\n            raise CaptureError(",
        new="        if False:\n            raise CaptureError(",
    ),
    Mutant(
        name="eager host sync does not wait",
        mistake="An eager op that reads a value back on the host (.item()) is charged "
        "like any launch: the host runs ahead instead of waiting for the GPU.",
        module=M,
        old="            if op.syncs_host or op.copies_from_host:  # a synchronous op",
        new="            if op.copies_from_host:  # a synchronous op",
    ),
    Mutant(
        name="replay rebinds instead of writing in place",
        mistake="Replay computes each node into a new array instead of writing into the "
        "node's recorded buffer, so the static output and the next node never see it.",
        module=M,
        old="            np.copyto(node.dst, node.op.fn(node.src))",
        new="            node = Node(node.op, node.src, node.op.fn(node.src))",
    ),
    Mutant(
        name="replay launches once per node",
        mistake="Replay charges one launch per recorded kernel, which is eager execution "
        "with extra steps: the graph saves nothing.",
        module=M,
        old="""        for node in graph.nodes:
            np.copyto(node.dst, node.op.fn(node.src))""",
        new="""        for node in graph.nodes:
            self._issue("kernel", node.op.name, self.launch_us, 0.0)
            np.copyto(node.dst, node.op.fn(node.src))""",
    ),
    Mutant(
        name="replay forgets the node cost",
        mistake="Replay charges the GPU only the kernels' own time, forgetting that every "
        "graph node still costs a little GPU time of its own.",
        module=M,
        old="gpu_work = sum(node.op.gpu_us + self.node_us for node in graph.nodes)",
        new="gpu_work = sum(node.op.gpu_us for node in graph.nodes)",
    ),
    Mutant(
        name="replay allowed during a capture",
        mistake="Replay does not check for an open capture, so a graph can be replayed "
        "into the middle of another one's recording.",
        module=M,
        old="""        if self._capturing is not None:
            raise CaptureError("cannot replay a graph while a capture is open")""",
        new="""        pass""",
    ),
    Mutant(
        name="runner forgets to copy the input",
        mistake="The runner replays without copying the new input into the static buffer: "
        "every call after the first returns the answer for the first input.",
        module=M,
        old="""        np.copyto(entry.static_input, x)
        return entry.replay()""",
        new="""        return entry.replay()""",
    ),
    Mutant(
        name="runner returns a copy of the output",
        mistake="The runner returns a copy of the static output, hiding that the real "
        "thing hands back the same buffer every replay and overwrites it.",
        module=M,
        old="""        np.copyto(entry.static_input, x)
        return entry.replay()""",
        new="""        np.copyto(entry.static_input, x)
        return entry.replay().copy()""",
    ),
    Mutant(
        name="static input is the caller's array",
        mistake="The runner captures on the caller's own array instead of a buffer of its "
        "own, so the graph reads whatever the caller later does with that array.",
        module=M,
        old="""        static_input = self.device.pool.allocate(x.shape, x.dtype)
        np.copyto(static_input, x)""",
        new="""        static_input = x""",
    ),
    Mutant(
        name="no warm-up before capture",
        mistake="The runner captures without one eager run first.",
        module=M,
        old="        run_eager(self.ops, self.device, static_input)\n",
        new="",
    ),
    Mutant(
        name="capture after the window closed",
        mistake="The runner ignores the closed capture window and captures a new shape "
        "silently in the middle of serving.",
        module=M,
        old="            if not self.capture_window_open:",
        new="            if False:",
    ),
    Mutant(
        name="graphs keyed by batch size",
        mistake="Graphs are keyed by the batch size alone, so an input of another width "
        "with the same batch replays the wrong graph.",
        module=M,
        old="""        entry = self.graphs.get(x.shape)
        if entry is None:""",
        new="""        entry = next((e for s, e in self.graphs.items() if s[0] == x.shape[0]), None)
        if entry is None:""",
    ),
    Mutant(
        name="dtype checked only for captured shapes",
        mistake="The dtype is checked only once a shape has a graph, so a first input of "
        "the wrong dtype captures a graph in that dtype.",
        module=M,
        old="""        expected = self.dtype
        if expected is None and""",
        new="""        expected = None
        if""",
    ),
    Mutant(
        name="non-array input not refused",
        mistake="The runner does not check that the input is a numpy array, and fails "
        "later with an unrelated AttributeError.",
        module=M,
        old="""    if not isinstance(x, np.ndarray):
        raise TypeError""",
        new="""    if False:
        raise TypeError""",
    ),
    Mutant(
        name="capture runs the kernels",
        mistake="While capturing, launch() computes each kernel into its new buffer, as an "
        "eager run would: on a GPU nothing runs until the replay, and a test reading an "
        "output right after capture sees values that were never computed.",
        module=M,
        old="        graph.nodes.append(Node(op, x, out))",
        new="        np.copyto(out, op.fn(x))\n        graph.nodes.append(Node(op, x, out))",
    ),
    Mutant(
        name="captured buffer in the input's dtype",
        mistake="The output buffer of a recorded op takes the dtype of the op's input, so an "
        "op that casts (to half precision, to token ids) replays into the wrong dtype and "
        "np.copyto converts its result without a word.",
        module=M,
        old="out = self.pool.allocate(probe.shape, probe.dtype)",
        new="out = self.pool.allocate(probe.shape, x.dtype)",
    ),
    Mutant(
        name="copyto arguments swapped",
        mistake="np.copyto(dst, src) called as (src, dst): the caller's array is overwritten "
        "with the previous input, and the graph replays on stale data.",
        module=M,
        old="""        np.copyto(entry.static_input, x)
        return entry.replay()""",
        new="""        np.copyto(x, entry.static_input)
        return entry.replay()""",
    ),
    Mutant(
        name="input copied after the replay",
        mistake="The runner replays first and copies the new input in afterwards, so every "
        "call returns the result for the input of the call before.",
        module=M,
        old="""        np.copyto(entry.static_input, x)
        return entry.replay()""",
        new="""        out = entry.replay()
        np.copyto(entry.static_input, x)
        return out""",
    ),
    Mutant(
        name="closed window forgets the captured shapes",
        mistake="Once the capture window is closed the runner treats every shape as new, so "
        "shapes it captured raise or run eagerly instead of replaying.",
        module=M,
        old="""        entry = self.graphs.get(x.shape)
        if entry is None:""",
        new="""        entry = self.graphs.get(x.shape) if self.capture_window_open else None
        if entry is None:""",
    ),
    Mutant(
        name="dtype-free runner casts into a captured shape",
        mistake="A runner built with dtype=None lets a captured shape come back in another "
        "dtype, and np.copyto casts it into the static input (0.5 becomes 0 in an int64 "
        "buffer).",
        module=M,
        old="            expected = self.graphs[x.shape].static_input.dtype  # fixed once captured",
        new="            expected = None",
    ),
]
