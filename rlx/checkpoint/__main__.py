"""`python -m rlx.checkpoint resave-extra <global_step_N dir>`: rewrite a step's extra state in the safe format."""
import sys

from rlx.checkpoint.engine_state import resave_extra

if len(sys.argv) != 3 or sys.argv[1] != "resave-extra":
    print("usage: python -m rlx.checkpoint resave-extra <global_step_N dir>\n  Rewrites the step's "
          "extra_rank*.pt files so that they load with torch.load(weights_only=True). It loads the old files "
          "the unsafe way: run it only on a checkpoint you wrote yourself.", file=sys.stderr)
    sys.exit(2)
for p in resave_extra(sys.argv[2]):
    print(f"re-saved {p}")
