from tests.security.fast import _fast_password_hashing  # noqa: F401
