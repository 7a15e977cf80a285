TRACED GRAPH
 ===== AFTER POST GRAD =====
 site-packages/torch/fx/_lazy_graph_module.py class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "bf16[4096, 4096][4096, 1]cuda:0"):
        # File: ops/softmax/spec.py:42 in <lambda>, code: reference=lambda x: torch.softmax(x, dim=-1),
        convert_element_type: "f32[4096, 4096][4096, 1]cuda:0" = torch.ops.prims.convert_element_type.default(arg0_1, torch.float32);  arg0_1 = None

        # No stacktrace found for following nodes
        prepare_softmax_online_default = torch.ops.prims.prepare_softmax_online.default(convert_element_type, -1)
        getitem: "f32[4096, 1][1, 1]cuda:0" = prepare_softmax_online_default[0]
        getitem_1: "f32[4096, 1][1, 1]cuda:0" = prepare_softmax_online_default[1];  prepare_softmax_online_default = None
        sub_tensor: "f32[4096, 4096][4096, 1]cuda:0" = torch.ops.aten.sub.Tensor(convert_element_type, getitem);  convert_element_type = getitem = None
        exp_default: "f32[4096, 4096][4096, 1]cuda:0" = torch.ops.aten.exp.default(sub_tensor);  sub_tensor = None

        # File: ops/softmax/spec.py:42 in <lambda>, code: reference=lambda x: torch.softmax(x, dim=-1),
        div: "f32[4096, 4096][4096, 1]cuda:0" = torch.ops.aten.div.Tensor(exp_default, getitem_1);  exp_default = getitem_1 = None
        convert_element_type_1: "bf16[4096, 4096][4096, 1]cuda:0" = torch.ops.prims.convert_element_type.default(div, torch.bfloat16);  div = None
        return (convert_element_type_1,)
