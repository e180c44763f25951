from gitlib import *
init()
commit("Base config", config_DOT_py="NAME = 'collector'\nTIMEOUT_S = 30\nMAX_RETRIES = 0\nLOG_LEVEL = 'info'\n", app_DOT_py="import config\n")
git("checkout", "-q", "-b", "feature/retries")
commit("Add retries", config_DOT_py="NAME = 'collector'\nTIMEOUT_S = 45\nMAX_RETRIES = 4\nBACKOFF = 1.5\nLOG_LEVEL = 'info'\n")
commit("Use retries", app_DOT_py="import config\n\nprint(config.MAX_RETRIES, config.BACKOFF)\n")
git("checkout", "-q", "main")
commit("Tune timeout", config_DOT_py="NAME = 'collector'\nTIMEOUT_S = 120\nMAX_RETRIES = 0\nLOG_LEVEL = 'info'\nSTRAGGLER_FACTOR = 2.0\n")
