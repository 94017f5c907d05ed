"""kvtier/demo."""
