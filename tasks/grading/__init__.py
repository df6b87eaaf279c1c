"""The reward.

A patch graded by the official swebench harness and by the guard, in clean runs the patch cannot read past.
"""
