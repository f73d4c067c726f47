"""Text and chat encoding: rendered text + target character spans -> token ids + loss mask."""
