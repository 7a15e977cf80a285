TRACED GRAPH
 ===== AFTER POST GRAD =====
 site-packages/torch/fx/_lazy_graph_module.py class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "bf16[4096, 4096][4096, 1]cuda:0", arg1_1: "bf16[4096, 4096][4096, 1]cuda:0"):
        # No stacktrace found for following nodes
        mm: "bf16[4096, 4096][4096, 1]cuda:0" = torch.ops.aten.mm.default(arg0_1, arg1_1);  arg0_1 = arg1_1 = None
        return (mm,)
