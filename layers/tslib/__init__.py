"""TSLib's layer modules under TSLib's names, signatures and state_dict keys (Time-Series-Library's layers/), so
that a TSLib model file dropped into models/ runs unchanged. Each is written on this codebase's own blocks in
layers/; `layers.<name>` (TSLib's spelling) and `layers.tslib.<name>` are the same module (layers/__init__.py)."""
