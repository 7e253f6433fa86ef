"""Phase 04, lab 01 (model inputs): the mistakes students make, and the lab's steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

MODULE = "mini_vllm.engine.model_inputs"

MUTANTS = [
    Mutant(
        name="cumulative lengths without the leading 0",
        mistake="query_start_loc is the running sum of the query lengths without the 0 in "
        "front (a plain cumsum), so it has num_reqs entries and row r's start is wrong",
        module=MODULE,
        old="starts = [0]\n        for q in self.query_lens:\n"
        "            starts.append(starts[-1] + q)",
        new="starts = []\n        total = 0\n        for q in self.query_lens:\n"
        "            total += q\n            starts.append(total)",
    ),
    Mutant(
        name="positions off by one after the first chunk",
        mistake="a row that already has tokens cached starts its positions one past "
        "num_computed_tokens (as if the last cached token sat at num_computed_tokens), "
        "so every decode and every later prompt chunk is shifted by one",
        module=MODULE,
        old="positions.extend(row.positions)",
        new="positions.extend(\n"
        "            range(\n"
        "                row.num_computed_tokens + (row.num_computed_tokens > 0),\n"
        "                row.context_len + (row.num_computed_tokens > 0),\n"
        "            )\n"
        "        )",
    ),
    Mutant(
        name="positions restart at 0 in every chunk",
        mistake="positions count from 0 within the step (range(num_new_tokens)), which is "
        "right for a first prefill chunk only",
        module=MODULE,
        old="positions.extend(row.positions)",
        new="positions.extend(range(row.num_new_tokens))",
    ),
    Mutant(
        name="positions from the live request's length",
        mistake="positions are counted back from the live request's length "
        "(len(row.seq.token_ids)), which is right for a decode scheduled from a fresh "
        "request and wrong for every prompt chunk and once the step has been applied",
        module=MODULE,
        old="positions.extend(row.positions)",
        new="positions.extend(\n"
        "            range(\n"
        "                len(row.seq.token_ids) - row.num_new_tokens, len(row.seq.token_ids)\n"
        "            )\n"
        "        )",
    ),
    Mutant(
        name="slot from the logical block index",
        mistake="the slot is computed from the position alone (logical block index times "
        "block size plus offset), as in a contiguous cache, ignoring the block table",
        module=MODULE,
        old="slots.extend(\n            slot_mapping(\n"
        "                row.block_table, row.num_computed_tokens, row.context_len, "
        "output.block_size\n            )\n        )",
        new="slots.extend(row.positions)",
    ),
    Mutant(
        name="query and sequence lengths swapped",
        mistake="query_lens holds each row's context length and seq_lens its new-token count",
        module=MODULE,
        old="query_lens=[row.num_new_tokens for row in output.scheduled],\n"
        "        seq_lens=[row.context_len for row in output.scheduled],",
        new="query_lens=[row.context_len for row in output.scheduled],\n"
        "        seq_lens=[row.num_new_tokens for row in output.scheduled],",
    ),
    Mutant(
        name="logits index at the row's first token",
        mistake="the logits index points at the first new token of each sampling row "
        "instead of its last (same thing for a decode row, wrong for a prefill)",
        module=MODULE,
        old="logits_indices.append(len(input_ids) - 1)",
        new="logits_indices.append(len(input_ids) - row.num_new_tokens)",
    ),
    Mutant(
        name="logits index one past the row",
        mistake="the logits index is taken as the length of the flat list after the row's "
        "tokens, one past its last token: the next row's first token, or past the end",
        module=MODULE,
        old="logits_indices.append(len(input_ids) - 1)",
        new="logits_indices.append(len(input_ids))",
    ),
    Mutant(
        name="every row samples",
        mistake="every row gets a logits index, including a prompt chunk that stops short "
        "of the prompt's end (samples_token ignored)",
        module=MODULE,
        old="if row.samples_token:",
        new="if True:",
    ),
    Mutant(
        name="uniform decode from query lengths",
        mistake="uniform_decode is computed as 'every query length is 1', which calls a "
        "1-token prompt (and an empty batch) a uniform decode",
        module=MODULE,
        old="uniform_decode=output.is_uniform_decode,",
        new="uniform_decode=all(row.num_new_tokens == 1 for row in output.scheduled),",
    ),
    Mutant(
        name="block tables read from the live request",
        mistake="the block tables are read from row.seq (the live request), which has "
        "moved on or freed its blocks by the time the step is applied",
        module=MODULE,
        old="block_tables=[list(row.block_table) for row in output.scheduled],",
        new="block_tables=[list(row.seq.block_table) for row in output.scheduled],",
    ),
    Mutant(
        name="padded slots point at slot 0",
        mistake="padded tokens get slot 0 (a slot 'nobody uses') instead of -1, so the "
        "padding overwrites the K/V of whichever request holds block 0",
        module=MODULE,
        old="slot_mapping=inputs.slot_mapping + [PAD_SLOT_ID] * extra,",
        new="slot_mapping=inputs.slot_mapping + [0] * extra,",
    ),
    Mutant(
        name="padded rows read one key",
        mistake="a padded decode row gets sequence length 1 (it 'decodes one token') "
        "instead of 0, so attention reads a key for it through an empty block table",
        module=MODULE,
        old="seq_lens=inputs.seq_lens + [0] * extra,",
        new="seq_lens=inputs.seq_lens + [1] * extra,",
    ),
    Mutant(
        name="padded rows sample",
        mistake="the padded decode rows are added to the sampling rows too, so the batch "
        "returns tokens for rows that do not exist",
        module=MODULE,
        old="block_tables=inputs.block_tables + [[] for _ in range(extra)],",
        new="block_tables=inputs.block_tables + [[] for _ in range(extra)],\n"
        "            logits_indices=inputs.logits_indices\n"
        "            + list(range(inputs.num_tokens, num_tokens)),\n"
        "            sampling_rows=inputs.sampling_rows\n"
        "            + list(range(inputs.num_reqs, inputs.num_reqs + extra)),",
    ),
    Mutant(
        name="mixed batch padded with rows",
        mistake="a mixed batch is padded with rows as a uniform-decode batch is, so "
        "attention sees rows the eager path never captured",
        module=MODULE,
        old="if inputs.uniform_decode:",
        new="if True:",
    ),
    Mutant(
        name="rows padded when every query length is 1",
        mistake="pad_inputs decides to add rows by looking at the query lengths (all 1) "
        "instead of the batch's uniform-decode flag, so a batch of one-token prompts gets "
        "padded rows that no FULL graph was captured for",
        module=MODULE,
        old="if inputs.uniform_decode:",
        new="if all(q == 1 for q in inputs.query_lens):",
    ),
    Mutant(
        name="padded rows feed no token",
        mistake="a padded decode row is given query length 0, so the rows account for "
        "fewer tokens than the batch holds and query_start_loc stops short of num_tokens",
        module=MODULE,
        old="query_lens=inputs.query_lens + [1] * extra,",
        new="query_lens=inputs.query_lens + [0] * extra,",
    ),
    Mutant(
        name="padded ids are the pad slot",
        mistake="padded tokens get id -1 (the same 'nothing' marker as their slot), an id "
        "the embedding cannot look up",
        module=MODULE,
        old="input_ids=inputs.input_ids + [0] * extra,",
        new="input_ids=inputs.input_ids + [PAD_SLOT_ID] * extra,",
    ),
    Mutant(
        name="real count is the padded size",
        mistake="num_real_tokens records the size padded to instead of the real token "
        "count, so the outputs are sliced to the padded size",
        module=MODULE,
        old="        num_real_tokens=inputs.num_tokens,\n    )",
        new="        num_real_tokens=num_tokens,\n    )",
    ),
    Mutant(
        name="smaller size ignored",
        mistake="a size below the batch is taken as 'no padding needed' instead of an "
        "error, which hides a caller that picked the wrong graph",
        module=MODULE,
        old="    if extra < 0:\n        raise ValueError",
        new="    if extra < 0:\n        extra = 0\n    if False:\n        raise ValueError",
    ),
    Mutant(
        name="padding extends the caller's lists",
        mistake="the padding extends the input's own lists in place (list.extend) instead "
        "of building new ones, so the unpadded inputs change under the caller",
        module=MODULE,
        old="    padded = replace(\n        inputs,\n"
        "        input_ids=inputs.input_ids + [0] * extra,",
        new="    inputs.input_ids.extend([0] * extra)\n    padded = replace(\n        inputs,\n"
        "        input_ids=inputs.input_ids,",
    ),
    Mutant(
        name="real count not recorded when nothing is added",
        mistake="padding to the batch's own size returns the inputs unchanged, leaving "
        "num_real_tokens at -1",
        module=MODULE,
        old="return replace(inputs, num_real_tokens=inputs.num_tokens)",
        new="return inputs",
    ),
]

STEPS = {
    1: [f"{MODULE}:ModelInputs.query_start_loc"],
    2: [f"{MODULE}:prepare_inputs"],
    3: [f"{MODULE}:pad_inputs"],
}
