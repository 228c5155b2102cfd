// placeholder until the GPT model lands
