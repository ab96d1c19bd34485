"""`python -m unfoldformer …` (also what `torchrun -m unfoldformer train …` runs)."""
from .cli import main

raise SystemExit(main())
