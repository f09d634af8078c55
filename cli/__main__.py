"""`python -m mlx_qwen3asr.cli`: the mlxasr command."""

from __future__ import annotations

import sys

from .main import main

sys.exit(main())
