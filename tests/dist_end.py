"""The last call of every test worker run under `torch.distributed.run` or `accelerate launch`."""
import os, sys

def end(state):
    """Every rank at one barrier, the process group destroyed, then out without the interpreter's teardown: C++ threads met in
    that teardown aborted a rank after its work was done ('terminate called without an active exception', SIGABRT) in 5 of 40
    runs, and once in CI after the barrier and `destroy_process_group` alone"""
    state.wait_for_everyone(); state.destroy_process_group()
    sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
