"""Training numerics are bit-identical across refactors: a toy run's loss curve equals the one recorded before.

The Multi30k study's training grid may run on an older commit while the code moves (issue 52: the decoding engine
out of nmt/models/); a move that changed a product's order, an initialisation or the RNG's draws would make its
runs incomparable. Each model below trains 100 updates on a toy corpus (tiny sizes, dropout on, one thread) through
the Trainer, and every update's loss must equal the golden value recorded from the code before the move (atol 0).

The golden values are what one CPU kind computes (torch picks its kernels by instruction set, and they round
differently), so the comparison runs on CPUs of a recorded instruction set only.
Re-record with `NMT_RECORD_NUMERICS=1 pytest tests/test_training_numerics.py -s` and paste what it prints, only
when a change of training numerics is intended.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nmt.cli.common import compose
from nmt.data.dataset import prepare_data
from nmt.runtime import cpu_info
from nmt.training.trainer import Trainer
from tests.conftest import write

STEPS = 100

MODELS = {
    "transformer": ["model=transformer", "model.dim=32", "model.layers=2", "model.heads=4", "model.ffn_dim=64"],
    "luong_local_p": ["model=luong_local_p", "model.dim=32", "model.layers=1", "model.window_size=3"],
    "bahdanau": ["model=bahdanau", "model.dim=32", "model.embed_dim=32"],
}

# by the CPU's instruction set (`isa`): every update's loss as float.hex, one thread, recorded before the engine left
# nmt/models/: avx2 at 859ca88 on an AMD EPYC (Zen 3), avx512 at c11e0e9 on an Intel Xeon (AMX, AVX-512)
GOLDEN: dict[str, dict[str, str]] = {
    "avx2": {
        "transformer": """
        0x1.57502a02a02a0p+2 0x1.55fdd4ef40992p+2 0x1.5dc330c30c30cp+2 0x1.59f21d2e6cc45p+2
        0x1.59e8ae147ae14p+2 0x1.56197a3bf6c65p+2 0x1.52e1d37a6f4dfp+2 0x1.53302a2a2a2a3p+2
        0x1.52fbb56fd83bap+2 0x1.4994e0a72f054p+2 0x1.499b72620ae4cp+2 0x1.4cc3238e38e39p+2
        0x1.46dda82ad85e4p+2 0x1.4648f08708708p+2 0x1.3b89eac3d587bp+2 0x1.3e94ca8641fdcp+2
        0x1.428d211422845p+2 0x1.40d0a76e68576p+2 0x1.432f021084211p+2 0x1.3ad1ca37eeca3p+2
        0x1.38a1d2c0e49d3p+2 0x1.37421fdb97531p+2 0x1.3428d61bed61cp+2 0x1.37b3e55d39b60p+2
        0x1.3546cee773b9ep+2 0x1.31ba5c28f5c29p+2 0x1.2fc8220c9c5fdp+2 0x1.2f4afea712dcfp+2
        0x1.2823f4d22a7b0p+2 0x1.2fead1dfb632cp+2 0x1.2e798365f2683p+2 0x1.29dddb92b8288p+2
        0x1.2a0c153eac154p+2 0x1.27d49456217edp+2 0x1.26854d2adeedap+2 0x1.24f658bf258bfp+2
        0x1.256e108421084p+2 0x1.28db5e8efdb19p+2 0x1.257cd397829ccp+2 0x1.1fbd345d1745dp+2
        0x1.258e46514e023p+2 0x1.26cf07140e282p+2 0x1.259739e0d5b45p+2 0x1.1d33b162c58b1p+2
        0x1.1e529bf43ad9cp+2 0x1.20473177f61b3p+2 0x1.1cd6043b3d5b0p+2 0x1.19f809d89d89ep+2
        0x1.1e5bd10c4c048p+2 0x1.1fc0f5b6db6dbp+2 0x1.18a127350b881p+2 0x1.1da1075fde49cp+2
        0x1.18a86d3a06d3ap+2 0x1.19a73efbefbf0p+2 0x1.184b200000000p+2 0x1.1c2e9296d6929p+2
        0x1.15b546102b1dap+2 0x1.1646f78f78f79p+2 0x1.185049ba5e354p+2 0x1.0fc18d911b223p+2
        0x1.19c1f9ce739cep+2 0x1.0f8b4d5cd5cd6p+2 0x1.1255c16c16c17p+2 0x1.14b1308d3dcb1p+2
        0x1.12a78356d1409p+2 0x1.13c15c3562466p+2 0x1.0ffcf4045b81ap+2 0x1.13dd536a6d4dbp+2
        0x1.10f603759f22ap+2 0x1.10e55fb37072dp+2 0x1.0d551a1f58d10p+2 0x1.10426f0243f6fp+2
        0x1.0ea857324e40dp+2 0x1.0d1d000000000p+2 0x1.130c9574e6d81p+2 0x1.10aca06979f50p+2
        0x1.0ffeacc4baa3fp+2 0x1.10a7c5010db21p+2 0x1.1048e60bcc17ap+2 0x1.0fa80687d6344p+2
        0x1.0e607d83ba686p+2 0x1.08d26735a0e2ap+2 0x1.0ef7366a5b845p+2 0x1.06ca6231188c4p+2
        0x1.07bb3cf3cf3cfp+2 0x1.0d67a094f2095p+2 0x1.0c89628f5c28fp+2 0x1.0c20d0ac19d0bp+2
        0x1.09cfc6a395c6ap+2 0x1.0c305ce739ce7p+2 0x1.0c7bd9d89d89ep+2 0x1.087166cd9b367p+2
        0x1.0b2bfd58ded6ep+2 0x1.0ca8e52b99272p+2 0x1.098f51eb851ecp+2 0x1.08bcce47ef131p+2
        0x1.071fc1c1c1c1cp+2 0x1.07ddc5f92c5f9p+2 0x1.0a4a924924925p+2 0x1.0afc368a0473cp+2
""",
        "luong_local_p": """
        0x1.278c63c63c63cp+2 0x1.277059b8396bbp+2 0x1.27bc4d34d34d3p+2 0x1.273bdadc2fc05p+2
        0x1.27d790a3d70a4p+2 0x1.27a983759f22ap+2 0x1.27c811cf06adap+2 0x1.2704505050505p+2
        0x1.266c7c45979c9p+2 0x1.26a6fd6343eb2p+2 0x1.26dba8d9df51bp+2 0x1.265dd684bda13p+2
        0x1.264f6a0ab6179p+2 0x1.269e843843844p+2 0x1.26816574cae99p+2 0x1.262c54320feddp+2
        0x1.269d04508a114p+2 0x1.26688b86ac48dp+2 0x1.259514a5294a5p+2 0x1.25f0969696969p+2
        0x1.266fc93a581c9p+2 0x1.25c5d950c83fbp+2 0x1.2620345d1745dp+2 0x1.25de324fe852ep+2
        0x1.25578e070381cp+2 0x1.25579fbe76c8bp+2 0x1.24dff9b1d0143p+2 0x1.256d50d79435ep+2
        0x1.25a20d6a336c7p+2 0x1.253d86eb3e453p+2 0x1.25404ac2d4f4bp+2 0x1.25382061236a4p+2
        0x1.24ce9d362c9d3p+2 0x1.24ae56217ecdcp+2 0x1.24736d03acb55p+2 0x1.24b4048d159e2p+2
        0x1.2524f39ce739dp+2 0x1.24dbe7c8a60ddp+2 0x1.246fe0a72f054p+2 0x1.23ea4cccccccdp+2
        0x1.24ad5499d1daap+2 0x1.248a305e60bccp+2 0x1.2410c61f2a4bbp+2 0x1.2417b972e5cb9p+2
        0x1.238ed0eb66fd1p+2 0x1.234ff757ce881p+2 0x1.23a710ecf56bep+2 0x1.23f10e10e10e1p+2
        0x1.23f80fa69153dp+2 0x1.23e14edb6db6ep+2 0x1.2355e6a171025p+2 0x1.23921511e8d2bp+2
        0x1.232bf37c048d1p+2 0x1.240afbefbefbfp+2 0x1.22aa262762762p+2 0x1.2335a8e571a8ep+2
        0x1.23c4ebca1af28p+2 0x1.2369438438438p+2 0x1.222be56041893p+2 0x1.233a3e867d0d0p+2
        0x1.22716b5ad6b5bp+2 0x1.22e6cbf4bf4bfp+2 0x1.21fd71c71c71cp+2 0x1.22185b37e875bp+2
        0x1.236361f2a4bb0p+2 0x1.225009b4c6f9fp+2 0x1.2181ba47e5dafp+2 0x1.224b4ac9592b2p+2
        0x1.21f44af477ed9p+2 0x1.215b885fb3707p+2 0x1.219c14e5e0a73p+2 0x1.21ac7a5616a7ap+2
        0x1.228aeac283e9ap+2 0x1.21577f57f57f5p+2 0x1.21a0017ad2209p+2 0x1.2172a933a3b55p+2
        0x1.1fb2717f5e94dp+2 0x1.209caee172d4dp+2 0x1.21520e281c504p+2 0x1.20648e5e0a72fp+2
        0x1.1e60356fd83bap+2 0x1.20938eac040c2p+2 0x1.1faa21642c859p+2 0x1.1fce39dcee774p+2
        0x1.2012082082082p+2 0x1.1fd40df6b0df7p+2 0x1.1f9d251eb851fp+2 0x1.1fa72f53e62f5p+2
        0x1.1ede021fde022p+2 0x1.1f7faf7bdef7cp+2 0x1.1ea7f89d89d8ap+2 0x1.1dffcf9f3e7d0p+2
        0x1.1f16ec1a874bap+2 0x1.1ea2336c6fca5p+2 0x1.1e2320fedcbaap+2 0x1.1db8f9a723f79p+2
        0x1.1d89616161616p+2 0x1.1e3517e4b17e5p+2 0x1.1f28659659659p+2 0x1.1d29f9525d7eep+2
""",
        "bahdanau": """
        0x1.2dd9d4ad4ad4bp+2 0x1.2def766e0e5afp+2 0x1.2e12514514514p+2 0x1.2e6d291e81fd6p+2
        0x1.2d82bd70a3d71p+2 0x1.2aac22983759fp+2 0x1.2cbbab68a0474p+2 0x1.2b36181818182p+2
        0x1.2c6eb0774d0c7p+2 0x1.2da8429cbc14ep+2 0x1.28d2bfba47e5ep+2 0x1.271b9425ed098p+2
        0x1.272dca718a2d0p+2 0x1.299eb9ab9ab9bp+2 0x1.274604b809701p+2 0x1.2889333333333p+2
        0x1.2a76b98730e62p+2 0x1.26f631be7bc0fp+2 0x1.275896b5ad6b6p+2 0x1.244e81135c811p+2
        0x1.256dfc6d8b4fcp+2 0x1.29b350c83fb73p+2 0x1.267821bed61bfp+2 0x1.22a39fd0a5bbfp+2
        0x1.24dcabd5eaf58p+2 0x1.21a7b020c49bap+2 0x1.263cfaf4a6769p+2 0x1.22726102b1da4p+2
        0x1.229c0d6a336c7p+2 0x1.23db5fb632bd2p+2 0x1.2488b53d2b0b5p+2 0x1.21d9f3db92b83p+2
        0x1.21c432fcd0330p+2 0x1.1fb5cdc1cb5d5p+2 0x1.1e9f7a7cf013ap+2 0x1.210c8e38e38e4p+2
        0x1.21b2084210842p+2 0x1.1d7f9cd42e205p+2 0x1.1f65b43eb1a1fp+2 0x1.1d678ba2e8ba3p+2
        0x1.1f0c000000000p+2 0x1.1f4868fed1fdap+2 0x1.1d62642c8590bp+2 0x1.1fcaa3468d1a3p+2
        0x1.1fa54b08d3dcbp+2 0x1.1f4776b981daep+2 0x1.1d8c3b3d5af9ap+2 0x1.1b53cec4ec4ecp+2
        0x1.1f19e2ef3b3fcp+2 0x1.1e5626db6db6ep+2 0x1.2271c77ed8cafp+2 0x1.1c6c8f469598cp+2
        0x1.195f99999999ap+2 0x1.1ba7fbefbefbfp+2 0x1.1b74f00000000p+2 0x1.18708c373c8c3p+2
        0x1.1c1111840ac77p+2 0x1.185a778f78f79p+2 0x1.16e63b645a1cbp+2 0x1.1a8d3c2a7854fp+2
        0x1.1afadce739ce7p+2 0x1.1a66bb13b13b1p+2 0x1.17894c3b2a190p+2 0x1.1a37de293205ep+2
        0x1.17dc7ee30f952p+2 0x1.19470610fc5c3p+2 0x1.178c8fcbb5ec6p+2 0x1.18f5a564ac959p+2
        0x1.14d48939a85c4p+2 0x1.131d5e81323e3p+2 0x1.1abe092492492p+2 0x1.17f043f6f0244p+2
        0x1.14379035a8cdbp+2 0x1.15d8abfabfac0p+2 0x1.1650649fd0a5cp+2 0x1.1596f2d0c15f9p+2
        0x1.13f177cd8e80ap+2 0x1.1529905447a35p+2 0x1.14f46a2cd459bp+2 0x1.14ad8687d6344p+2
        0x1.15d9dd3431b57p+2 0x1.16ddb11339ad0p+2 0x1.1650e115062f0p+2 0x1.1453d42a150a8p+2
        0x1.14491a69a69a7p+2 0x1.12075745d1746p+2 0x1.130ed9999999ap+2 0x1.12a4e0ce8560dp+2
        0x1.0d6dc7b384c7bp+2 0x1.144d739ce739dp+2 0x1.144e000000000p+2 0x1.1218efdfbf7f0p+2
        0x1.16543fab1bdaep+2 0x1.12313b3fb8744p+2 0x1.13fb9e26af37cp+2 0x1.112919637021ep+2
        0x1.1118343434343p+2 0x1.13c24b17e4b18p+2 0x1.1138249249249p+2 0x1.0f39e0d5b4502p+2
""",
    },
    "avx512": {
        "transformer": """
        0x1.57502a02a02a0p+2 0x1.55fdd4ef40992p+2 0x1.5dc330c30c30cp+2 0x1.59f21d2e6cc45p+2
        0x1.59e8ae147ae14p+2 0x1.56197a3bf6c65p+2 0x1.52e1d5b45023ap+2 0x1.53302a2a2a2a3p+2
        0x1.52fbb56fd83bap+2 0x1.4994e1f58d0fbp+2 0x1.499b748fcbb5fp+2 0x1.4cc3212f684bep+2
        0x1.46dda82ad85e4p+2 0x1.4648f08708708p+2 0x1.3b89eac3d587bp+2 0x1.3e94c5f92c5f9p+2
        0x1.428d23f47e8fdp+2 0x1.40d0a76e68576p+2 0x1.432f021084211p+2 0x1.3ad1ca37eeca3p+2
        0x1.38a1d2c0e49d3p+2 0x1.37421fdb97531p+2 0x1.3428d61bed61cp+2 0x1.37b3e55d39b60p+2
        0x1.3546cee773b9ep+2 0x1.31ba5c28f5c29p+2 0x1.2fc8220c9c5fdp+2 0x1.2f4afea712dcfp+2
        0x1.2823f4d22a7b0p+2 0x1.2fead1dfb632cp+2 0x1.2e798365f2683p+2 0x1.29dddb92b8288p+2
        0x1.2a0c197e68198p+2 0x1.27d49456217edp+2 0x1.26854d2adeedap+2 0x1.24f658bf258bfp+2
        0x1.256e108421084p+2 0x1.28db5c40939a8p+2 0x1.257cd4e5e0a73p+2 0x1.1fbd345d1745dp+2
        0x1.258e441ec3922p+2 0x1.26cf084210842p+2 0x1.259739e0d5b45p+2 0x1.1d33b162c58b1p+2
        0x1.1e529bf43ad9cp+2 0x1.20473177f61b3p+2 0x1.1cd6043b3d5b0p+2 0x1.19f809d89d89ep+2
        0x1.1e5bd10c4c048p+2 0x1.1fc0f5b6db6dbp+2 0x1.18a127350b881p+2 0x1.1da1075fde49cp+2
        0x1.18a86c16c16c1p+2 0x1.19a73efbefbf0p+2 0x1.184b200000000p+2 0x1.1c2e9296d6929p+2
        0x1.15b546102b1dap+2 0x1.1646f78f78f79p+2 0x1.185049ba5e354p+2 0x1.0fc18d911b223p+2
        0x1.19c1f9ce739cep+2 0x1.0f8b4bf4bf4bfp+2 0x1.1255bf258bf26p+2 0x1.14b1308d3dcb1p+2
        0x1.12a78239e0d5bp+2 0x1.13c15c3562466p+2 0x1.0ffcf4045b81ap+2 0x1.13dd536a6d4dbp+2
        0x1.10f6024e6a171p+2 0x1.10e55fb37072dp+2 0x1.0d551a1f58d10p+2 0x1.10426f0243f6fp+2
        0x1.0ea856141f4d2p+2 0x1.0d1d015015015p+2 0x1.130c9574e6d81p+2 0x1.10ac9e36ef84fp+2
        0x1.0ffeacc4baa3fp+2 0x1.10a7c5010db21p+2 0x1.1048e60bcc17ap+2 0x1.0fa807d6343ebp+2
        0x1.0e607d83ba686p+2 0x1.08d26735a0e2ap+2 0x1.0ef737a6f4deap+2 0x1.06ca6231188c4p+2
        0x1.07bb3cf3cf3cfp+2 0x1.0d67a094f2095p+2 0x1.0c89628f5c28fp+2 0x1.0c20d0ac19d0bp+2
        0x1.09cfc593a6c59p+2 0x1.0c305ce739ce7p+2 0x1.0c7bd89d89d8ap+2 0x1.087168d1a3469p+2
        0x1.0b2bfc054e425p+2 0x1.0ca8e649c81adp+2 0x1.098f51eb851ecp+2 0x1.08bccd391fbc5p+2
        0x1.071fc1c1c1c1cp+2 0x1.07ddc5f92c5f9p+2 0x1.0a4a924924925p+2 0x1.0afc356d1408ep+2
""",
        "luong_local_p": """
        0x1.278c63c63c63cp+2 0x1.277059b8396bbp+2 0x1.27bc4d34d34d3p+2 0x1.273bd9889f2bcp+2
        0x1.27d790a3d70a4p+2 0x1.27a983759f22ap+2 0x1.27c811cf06adap+2 0x1.2704505050505p+2
        0x1.266c7c45979c9p+2 0x1.26a6fd6343eb2p+2 0x1.26dba8d9df51bp+2 0x1.265dd684bda13p+2
        0x1.264f6a0ab6179p+2 0x1.269e843843844p+2 0x1.26816574cae99p+2 0x1.262c54320feddp+2
        0x1.269d04508a114p+2 0x1.26688b86ac48dp+2 0x1.259514a5294a5p+2 0x1.25f0969696969p+2
        0x1.266fc93a581c9p+2 0x1.25c5d950c83fbp+2 0x1.2620345d1745dp+2 0x1.25de324fe852ep+2
        0x1.25578e070381cp+2 0x1.25579fbe76c8bp+2 0x1.24dff9b1d0143p+2 0x1.256d50d79435ep+2
        0x1.25a20d6a336c7p+2 0x1.253d86eb3e453p+2 0x1.25404ac2d4f4bp+2 0x1.25382061236a4p+2
        0x1.24ce9d362c9d3p+2 0x1.24ae56217ecdcp+2 0x1.24736d03acb55p+2 0x1.24b4048d159e2p+2
        0x1.2524f39ce739dp+2 0x1.24dbe6a171025p+2 0x1.246fe0a72f054p+2 0x1.23ea4cccccccdp+2
        0x1.24ad5499d1daap+2 0x1.248a2f305e60cp+2 0x1.2410c61f2a4bbp+2 0x1.2417b972e5cb9p+2
        0x1.238ed0eb66fd1p+2 0x1.234ff757ce881p+2 0x1.23a70ecf56be7p+2 0x1.23f10e10e10e1p+2
        0x1.23f80fa69153dp+2 0x1.23e14edb6db6ep+2 0x1.2355e45306eb4p+2 0x1.23921511e8d2bp+2
        0x1.232bf37c048d1p+2 0x1.240afbefbefbfp+2 0x1.22aa276276276p+2 0x1.2335a8e571a8ep+2
        0x1.23c4ea712dcf8p+2 0x1.2369438438438p+2 0x1.222be56041893p+2 0x1.233a3d587ab0fp+2
        0x1.22716b5ad6b5bp+2 0x1.22e6cbf4bf4bfp+2 0x1.21fd71c71c71cp+2 0x1.221858469ee58p+2
        0x1.236361f2a4bb0p+2 0x1.225009b4c6f9fp+2 0x1.2181ba47e5dafp+2 0x1.224b4ac9592b2p+2
        0x1.21f44af477ed9p+2 0x1.215b885fb3707p+2 0x1.219c14e5e0a73p+2 0x1.21ac7a5616a7ap+2
        0x1.228aeac283e9ap+2 0x1.21577e07e07e0p+2 0x1.21a0017ad2209p+2 0x1.2172a933a3b55p+2
        0x1.1fb2717f5e94dp+2 0x1.209caee172d4dp+2 0x1.21520e281c504p+2 0x1.20648fac687d6p+2
        0x1.1e60356fd83bap+2 0x1.20938eac040c2p+2 0x1.1faa21642c859p+2 0x1.1fce39dcee774p+2
        0x1.2012082082082p+2 0x1.1fd40df6b0df7p+2 0x1.1f9d251eb851fp+2 0x1.1fa7317a9f318p+2
        0x1.1ede021fde022p+2 0x1.1f7faf7bdef7cp+2 0x1.1ea7f89d89d8ap+2 0x1.1dffcf9f3e7d0p+2
        0x1.1f16ec1a874bap+2 0x1.1ea2336c6fca5p+2 0x1.1e2320fedcbaap+2 0x1.1db8f9a723f79p+2
        0x1.1d89616161616p+2 0x1.1e3517e4b17e5p+2 0x1.1f28659659659p+2 0x1.1d29f9525d7eep+2
""",
        "bahdanau": """
        0x1.2dd9d5fd5fd60p+2 0x1.2def766e0e5afp+2 0x1.2e12514514514p+2 0x1.2e6d291e81fd6p+2
        0x1.2d82bd70a3d71p+2 0x1.2aac22983759fp+2 0x1.2cbbab68a0474p+2 0x1.2b36181818182p+2
        0x1.2c6eb0774d0c7p+2 0x1.2da8429cbc14ep+2 0x1.28d2bd8c8714bp+2 0x1.271b9425ed098p+2
        0x1.272dca718a2d0p+2 0x1.299eb9ab9ab9bp+2 0x1.274604b809701p+2 0x1.2889333333333p+2
        0x1.2a76b98730e62p+2 0x1.26f631be7bc0fp+2 0x1.275896b5ad6b6p+2 0x1.244e81135c811p+2
        0x1.256dfc6d8b4fcp+2 0x1.29b3530eca864p+2 0x1.26782094f2095p+2 0x1.22a39e55d39b6p+2
        0x1.24dcabd5eaf58p+2 0x1.21a7b020c49bap+2 0x1.263cfaf4a6769p+2 0x1.22726102b1da4p+2
        0x1.229c0d6a336c7p+2 0x1.23db5fb632bd2p+2 0x1.2488b53d2b0b5p+2 0x1.21d9f3db92b83p+2
        0x1.21c432fcd0330p+2 0x1.1fb5cdc1cb5d5p+2 0x1.1e9f7a7cf013ap+2 0x1.210c8f5c28f5cp+2
        0x1.21b206318c632p+2 0x1.1d7f9cd42e205p+2 0x1.1f65b58d0fac7p+2 0x1.1d678ba2e8ba3p+2
        0x1.1f0bfdcd758ffp+2 0x1.1f4868fed1fdap+2 0x1.1d62642c8590bp+2 0x1.1fcaa3468d1a3p+2
        0x1.1fa54c8178a4dp+2 0x1.1f4776b981daep+2 0x1.1d8c3b3d5af9ap+2 0x1.1b53cec4ec4ecp+2
        0x1.1f19e2ef3b3fcp+2 0x1.1e5626db6db6ep+2 0x1.2271c77ed8cafp+2 0x1.1c6c8f469598cp+2
        0x1.195f99999999ap+2 0x1.1ba7fbefbefbfp+2 0x1.1b74f00000000p+2 0x1.18708c373c8c3p+2
        0x1.1c1112dcf7ea7p+2 0x1.185a778f78f79p+2 0x1.16e6395810625p+2 0x1.1a8d3c2a7854fp+2
        0x1.1afadad6b5ad7p+2 0x1.1a66bde3de3dep+2 0x1.17894c3b2a190p+2 0x1.1a37de293205ep+2
        0x1.17dc7ee30f952p+2 0x1.19470610fc5c3p+2 0x1.178c8fcbb5ec6p+2 0x1.18f5a564ac959p+2
        0x1.14d48939a85c4p+2 0x1.131d5e81323e3p+2 0x1.1abe07d6343ebp+2 0x1.17f043f6f0244p+2
        0x1.14379035a8cdbp+2 0x1.15d8abfabfac0p+2 0x1.1650649fd0a5cp+2 0x1.1596f1b77c279p+2
        0x1.13f177cd8e80ap+2 0x1.1529905447a35p+2 0x1.14f46b5ad6b5bp+2 0x1.14ad8687d6344p+2
        0x1.15d9dd3431b57p+2 0x1.16ddb11339ad0p+2 0x1.1650e115062f0p+2 0x1.1453d269349a5p+2
        0x1.14491a69a69a7p+2 0x1.12075745d1746p+2 0x1.130ed9999999ap+2 0x1.12a4dfbb28dfcp+2
        0x1.0d6dc7b384c7bp+2 0x1.144d739ce739dp+2 0x1.144dfd89d89d9p+2 0x1.1218efdfbf7f0p+2
        0x1.16543fab1bdaep+2 0x1.12313b3fb8744p+2 0x1.13fb9e26af37cp+2 0x1.112919637021ep+2
        0x1.1118343434343p+2 0x1.13c24b17e4b18p+2 0x1.1138249249249p+2 0x1.0f39e0d5b4502p+2
""",
    },
}


@pytest.fixture(scope="module")
def corpus(toy_dir, tmp_path_factory) -> Path:
    """400 training pairs, 20 validation pairs, their tokenizer and cache prepared once."""
    out = tmp_path_factory.mktemp("numerics")
    for split, n in (("train", 400), ("valid", 20)):
        for side in ("src", "tgt"):
            write(out / f"{split}.{side}", (toy_dir / f"{split}.{side}").read_text().splitlines()[:n])
    prepare_data(compose("config", overrides(out, "transformer")).data, log=lambda line: None)
    return out


def overrides(corpus: Path, name: str) -> list[str]:
    return [
        "data=toy",
        "data.synthetic=null",
        f"data.train={corpus}/train",
        f"data.valid={corpus}/valid",
        "data.test=null",
        "data.vocab_size=100",
        f"data.cache_dir={corpus}/cache",
        *MODELS[name],
        "model.dropout=0.2",
        f"train.max_steps={STEPS}",
        "train.batch_tokens=256",
        "train.warmup=10",
        f"train.valid_every={STEPS}",
        f"train.save_every={STEPS}",
        "train.threads=1",
        "train.progress=false",
        "train.seed=3",
        "train.valid_bleu_sentences=4",
        "decode.max_len_a=1.0",
        "decode.max_len_b=2",
    ]


def loss_curve(corpus: Path, name: str, run_dir: Path) -> list[float]:
    """Every update's mean token loss over STEPS updates of `name`."""
    trainer = Trainer(compose("config", overrides(corpus, name)), run_dir)
    losses: list[float] = []
    step = trainer.train_step

    def recorded(*args, **kwargs):
        loss = step(*args, **kwargs)
        losses.append(loss)
        return loss

    trainer.train_step = recorded
    trainer.fit()
    return losses


def parse(text: str) -> list[float]:
    return [float.fromhex(word) for word in text.split()]


def isa() -> str:
    """The CPU's widest vector instructions: which of torch's kernels (and their rounding) training runs on."""
    flags = set(cpu_info("flags").split())
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


@pytest.mark.parametrize("name", list(MODELS))
def test_loss_curve_is_the_recorded_one(name, corpus, tmp_path):
    record = os.environ.get("NMT_RECORD_NUMERICS")
    if not record and isa() not in GOLDEN:
        pytest.skip(
            f"loss curves recorded on {', '.join(GOLDEN)} CPUs only (this one: {isa()}): other kernels round otherwise"
        )
    losses = loss_curve(corpus, name, tmp_path / name)
    assert len(losses) == STEPS and None not in losses
    if record:
        lines = [" ".join(x.hex() for x in losses[i : i + 4]) for i in range(0, STEPS, 4)]
        print(f'\n        "{name}": """\n' + "\n".join(lines) + '\n""",')
        return
    golden = [float.fromhex(word) for word in GOLDEN[isa()][name].split()]
    assert losses == golden, next(
        f"update {i + 1}: {got!r} != recorded {want!r}"
        for i, (got, want) in enumerate(zip(losses, golden))
        if got != want
    )
