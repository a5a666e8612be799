"""The console's modal screens: backfill, disable note, run details, help, quit."""

from .backfill import BackfillScreen
from .details import RunDetails
from .help import HelpScreen
from .prompt import NotePrompt
from .quit import QuitPrompt

__all__ = ["BackfillScreen", "HelpScreen", "NotePrompt", "QuitPrompt", "RunDetails"]
