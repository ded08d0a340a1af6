import sys
import torch
torch.set_flush_denormal(True)
from fairseq_cli.train import cli_main
sys.argv[0] = "fairseq-train"
cli_main()
