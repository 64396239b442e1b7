"""Fine-tuning pretrained encoders on sentence(-pair) classification and regression (GLUE task shapes)."""
