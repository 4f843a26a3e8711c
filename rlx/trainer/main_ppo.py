"""verl's entry point: `python -m rlx.trainer.main_ppo key=value ...` (also --check, --help, --cfg job,
--config-path / --config-name). The command line is rlx.trainer.cli; the Ray launch, rlx.trainer.launch."""
import sys

from rlx.trainer.cli import main

if __name__ == "__main__":
    from rlx.trainer.console import keep_worker_output_in_ray_logs

    keep_worker_output_in_ray_logs()  # before anything imports Ray
    sys.exit(main())
