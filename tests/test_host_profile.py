"""jobs/local/host_profile: py-spy stacks sorted into the parts of a training step."""

from __future__ import annotations

from lartpc.jobs.local.host_profile import spy_parts, spy_table

STEP = "fit (lartpc/train/loop.py:28);run_epoch (lartpc/train/loop.py:48);" \
       "Trainer.step (lartpc/train/trainer.py:233)"


def test_each_stack_goes_to_the_first_part_that_matches():
    lines = [
        f"{STEP};NoiseMeter.forward_backward (noise.py:162);SparseConvolution.forward "
        "(conv.py:755);get_indice_pairs (ops.py:156) 30\n",
        f"{STEP};NoiseMeter.forward_backward (noise.py:162);Module._call_impl "
        "(module.py:1789) 50\n",
        f"{STEP};NoiseMeter.forward_backward (noise.py:172);Tensor.backward (_tensor.py:623) 60\n",
        f"{STEP};World.step_optimizer (world.py:152);Adam.step (adam.py:248) 40\n",
        f"{STEP} 5\n",
        "fit (lartpc/train/loop.py:36);Checkpointer.save (checkpoint.py:290) 10\n",
        "\n",
        "_run_module_as_main (<frozen runpy>:198) 5\n",
    ]
    parts = spy_parts(lines)
    assert parts == {"forward: spconv rulebooks (get_indice_pairs)": 30,
                     "forward: the rest, loss included": 50, "backward": 60,
                     "optimizer step (Adam)": 40,
                     "rest of Trainer.step (loss/accuracy read-back, record)": 5,
                     "epoch end: checkpoint": 10, "other": 5}
    table = spy_table(parts, steps=10, rate_hz=100.0)
    # 60 samples at 100 Hz over 10 steps: 60 ms per step; 60 of 200 samples
    assert "| backward | 60.00 | 30.0 % |" in table
    assert "| set_lr | 0.00 | 0.0 % |" in table


def test_aten_calls_are_counted_per_step_and_views_do_not_compute():
    import torch
    from lartpc.jobs.local.host_profile import main_thread_work

    x = torch.randn(8, 8)
    with torch.profiler.profile() as prof:
        for _ in range(2):  # two "steps": a product, a view, an allocation, an addition
            y = torch.matmul(x, x).view(-1)
            torch.empty(3)
            y.add_(1)
    calls, work = main_thread_work(prof.events(), steps=2)
    assert work == 2  # matmul (which calls mm: counted once) and add_
    assert calls == 4  # and the view and the allocation
