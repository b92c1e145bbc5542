"""Pretraining: run config, optimizers and schedules, objectives, mesh and sharded state, the jitted step,
checkpoints, metrics and the loop. `bertjax pretrain` (bertjax/commands/pretrain.py) is the entry point.

Read in data-flow order: run_config -> mesh -> state -> objectives -> step -> checkpoints -> metrics -> loop.
"""
