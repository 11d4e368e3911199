"""The rubric lab: improve a rubric against fixed answers and people's verdicts.

Placeholder while the package is built; see the modules.
"""
