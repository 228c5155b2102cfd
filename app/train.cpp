// placeholder until the trainer lands
