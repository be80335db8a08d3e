"""`kvserve eval`: accuracy regression per task type, a baseline against candidates.

Flow: tasks (a JSONL file or the built-in generators) -> every target answers every task
(greedy, fixed max tokens, cached per target) -> per-item scores, ROUGE-L and agreement against
the baseline -> per-type summary with paired-bootstrap intervals and a verdict -> result.json,
outputs.jsonl, a terminal table and report.html."""
