"""The in-sandbox runner. Standard library only; never imports Django, controlplane or
sandbox_host (DESIGN.md: it runs inside the sandbox with nothing else installed)."""
