"""The machine layer: what the host is (``env``: inventory, fingerprint), how busy it is
(``state``, ``foreign_load``) and how fast its cores are today (``probe``).

It imports only ``schema``; torch is imported lazily inside the functions that need it, so
the pytest front door stays torch-free.
"""
