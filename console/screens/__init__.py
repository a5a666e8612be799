"""The console's modal screens: backfill, disable note, run details, help."""

from .backfill import BackfillScreen
from .details import RunDetails
from .help import HelpScreen
from .prompt import NotePrompt

__all__ = ["BackfillScreen", "HelpScreen", "NotePrompt", "RunDetails"]
