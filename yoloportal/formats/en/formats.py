"""Date and time formats for the pages and admin: one 24-hour clock with its zone everywhere.

Django's English formats are "Dec. 3, 2026, 9:17 p.m." (no zone) while the waiting reasons,
the CLI and the API say "21:43 UTC": a job page read "Estimated start Dec. 3, 2026, 9:43 p.m."
beside "expected 21:43 UTC" (trial 16, G14). Localisation is always on since Django 5, so
settings.DATETIME_FORMAT alone would not apply: these are found through FORMAT_MODULE_PATH.
"""

DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i"
DATETIME_FORMAT = "Y-m-d H:i T"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
