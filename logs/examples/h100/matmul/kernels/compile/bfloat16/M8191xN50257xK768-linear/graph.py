TRACED GRAPH
 ===== __compiled_fn_3_5c17ee69_febd_4a0e_b5da_0d72b7b6398b =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_args_0_: "bf16[8191, 768][768, 1]cuda:0", L_args_1_: "bf16[768, 50257][1, 768]cuda:0"):
        l_args_0_ = L_args_0_
        l_args_1_ = L_args_1_

        # No stacktrace found for following nodes
        matmul: "bf16[8191, 50257][50257, 1]cuda:0" = torch.matmul(l_args_0_, l_args_1_);  l_args_0_ = l_args_1_ = None
        return (matmul,)
