"""What the two asynchronous runners share: roles, messages, staleness control, life cycle.

  runtime.py          the life cycle of a run: launch, ready barrier, drive, stop
  vehicles.py         what carries the roles: worker processes (AReaL-style) or threads
  interfaces.py       the Protocols the vehicles provide (queues, flags, counters)
  contexts.py         what each role is handed: its config and only its channels
  messages.py         the picklable messages between the roles
  controller.py       reward, the ledger and the advantages around the scheduling core
  scheduling.py       every scheduling decision, model-free (the planner calls it too)
  dispatch.py         admission: which prompts go out, and when
  rollout.py          the rollout worker: chunked generation, interrupts
  trainer.py          the trainer worker: updates proposed for commit
  param_service.py    the one writer of the policy and its version clock
  weight_slots.py     the copies of the weights, read under a sequence lock
  forkserver.py       the clean server process the worker processes are forked from
  forkserver_init.py  imported by the fork server first: it dies with the process that
                      started it
  placement.py        CPU cores for the heavy roles
  layout.py           each rollout worker's and trainer rank's device; layouts that cannot work
  health.py           failing fast, and leaving no process behind

The entry points, `runners/areal.py` and `runners/threaded.py`, each pick a vehicle.
"""
