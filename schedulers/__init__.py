"""Built-in scheduler plugins, installed as ``paternoster.schedulers``."""
