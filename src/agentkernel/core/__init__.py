"""Core building blocks shared by every component: configuration, errors, extras."""
