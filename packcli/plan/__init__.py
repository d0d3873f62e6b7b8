"""Which samples go in which row.

The packing algorithms (pure), the plan with its overflow rules, and preference pairs kept together.
"""
