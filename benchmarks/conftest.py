import os

for _k in [k for k in os.environ if k.startswith("FUSION_SHIM")]:
    del os.environ[_k]
