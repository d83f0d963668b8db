"""The chat front, free of any web framework: admission, answers, reads, sessions, turn control.

HTTP, WebSocket and Lambda only translate to and from :class:`~.chat_front.ChatFront`.
"""
