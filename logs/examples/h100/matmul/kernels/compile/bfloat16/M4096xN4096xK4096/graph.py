TRACED GRAPH
 ===== __compiled_fn_1_d084fdfe_7c12_48ca_ace9_3e95a6b85ba9 =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_args_0_: "bf16[4096, 4096][4096, 1]cuda:0", L_args_1_: "bf16[4096, 4096][4096, 1]cuda:0"):
        l_args_0_ = L_args_0_
        l_args_1_ = L_args_1_

        # No stacktrace found for following nodes
        matmul: "bf16[4096, 4096][4096, 1]cuda:0" = torch.matmul(l_args_0_, l_args_1_);  l_args_0_ = l_args_1_ = None
        return (matmul,)
