TRACED GRAPH
 ===== __compiled_fn_1_76052267_7c6f_4283_9619_8d095e785026 =====
 site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "bf16[4096, 4096][4096, 1]cuda:0"):
        l_x_ = L_x_

        # File: ops/softmax/spec.py:42 in <lambda>, code: reference=lambda x: torch.softmax(x, dim=-1),
        softmax: "bf16[4096, 4096][4096, 1]cuda:0" = torch.softmax(l_x_, dim = -1);  l_x_ = None
        return (softmax,)
