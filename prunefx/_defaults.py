"""Defaults the library and the command line's help texts share, in a module that imports nothing.

``prunefx --help`` builds its help from these without importing torch; ``prunefx.spec`` and
``prunefx.metrics.backends`` read the same values, so each setting is declared once.
"""

# torchvision's own evaluation sizes: 299 for the inception family, 224 for every other image model.
TORCHVISION_SIZES = {"inception_v3": 299, "quantized_inception_v3": 299}
TORCHVISION_DEFAULT_SIZE = 224
# Ultralytics' default imgsz is 640 for every task; classifiers are trained and evaluated at 224.
YOLO_SIZES = {"classify": 224}
YOLO_DEFAULT_SIZE = 640

ONNX_OPSET = 18  # the opset prunefx exports (TorchScript exporter, as ultralytics uses); ONNX Runtime 1.31 runs it

FORMS = (
    "torchvision:NAME (e.g. torchvision:resnet50), ultralytics:NAME.yaml (e.g. ultralytics:yolov8n.yaml), "
    "a path to an ultralytics .pt checkpoint, or package.module:factory"
)
SIZES = (  # the default sizes above in words, for help texts
    f"{TORCHVISION_DEFAULT_SIZE} for torchvision, {TORCHVISION_SIZES['inception_v3']} for inception_v3, "
    f"{YOLO_DEFAULT_SIZE} for YOLO, {YOLO_SIZES['classify']} for YOLO classifiers"
)
TRUST_HELP = (  # for --trust-checkpoint
    "Unpickle checkpoints fully and evaluate model yamls as written (either can run any code the file holds): "
    "only for files you made or trust. Default: weights-only loading, known layers and activations only."
)

# --input of the commands that build a SPEC (prunefx.inputs reads it; kept here so --help imports nothing heavy)
INPUT_HELP = ("Example input instead of an image, repeatable (one positional input each): a shape with an optional "
              "dtype, e.g. 1x1x1024 or 1x128:int64 (integers drawn from 0..15), or a .pt file of tensors "
              "(read weights-only; a dict is keyword inputs); NAME=SHAPE or NAME=FILE for a keyword input "
              "(input_ids=1x16:int64); or package.module:function returning the inputs.")
