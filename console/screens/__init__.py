"""The console's modal screens: backfill, the one confirmation, disable note, run and audit details, help, quit."""

from console.screens.audit import AuditDetails
from console.screens.backfill import BackfillScreen
from console.screens.confirm import Confirm
from console.screens.details import RunDetails
from console.screens.help import HelpScreen
from console.screens.prompt import NotePrompt
from console.screens.quit import QuitPrompt

__all__ = ["AuditDetails", "BackfillScreen", "Confirm", "HelpScreen", "NotePrompt", "QuitPrompt", "RunDetails"]
