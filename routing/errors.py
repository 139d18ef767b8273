"""The one exception routing raises for bad input."""


class TopicError(ValueError):
    """An invalid topic or filter; the message says what is wrong and where."""
