"""`async_areal_style`: the AReaL-style runtime (paper §3-4), one module per role.

runtime.py (processes, barrier, shutdown), controller.py, rollout.py, trainer.py,
param_service.py, and protocol.py for the messages between them.
"""
