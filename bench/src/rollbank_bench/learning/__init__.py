"""The learning-integrity experiment (`rollbank bench learning`, issue #11); see command.py."""
