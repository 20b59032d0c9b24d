"""Example declarations: the seeds' candidates and systems, importable and plannable.

``foundry plan foundry.examples.seeds`` prints their decisions.
"""
