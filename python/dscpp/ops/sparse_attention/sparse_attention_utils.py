"""DeepSpeed's SparseAttentionUtils: longer position embeddings for BERT / RoBERTa, a tokenizer's maximum length,
BERT-style self-attention replaced by BertSparseSelfAttention, and padding a batch to a multiple of the block size
(then unpadding the output)."""
import torch
import torch.nn.functional as F

from .bert_sparse_self_attention import BertSparseSelfAttention
from .sparsity_config import SparsityConfig


class SparseAttentionUtils:

    @staticmethod
    def extend_position_embedding(model, max_position):
        """The position embeddings of a BERT / RoBERTa model tiled up to max_position (> the current length)."""
        if hasattr(model, "bert"):
            embeddings = model.bert.embeddings.position_embeddings
            original = embeddings.weight.size(0)
            if max_position <= original:
                raise ValueError(f"extend_position_embedding: max_position {max_position} must exceed the model's "
                                 f"{original} positions")
            multiples = max(1, max_position // original)
            embeddings.weight.data = embeddings.weight.repeat(multiples, 1)
        elif hasattr(model, "roberta"):
            # RoBERTa keeps positions 0 and 1 reserved: its table has max positions + 2 rows.
            embeddings = model.roberta.embeddings.position_embeddings
            original, size = embeddings.weight.shape
            original -= 2
            if max_position <= original:
                raise ValueError(f"extend_position_embedding: max_position {max_position} must exceed the model's "
                                 f"{original} positions")
            multiples = max(1, max_position // original)
            max_position += 2
            extended = embeddings.weight.new_empty(max_position, size)
            k = 2
            for _ in range(multiples):
                extended[k:k + original] = embeddings.weight[2:]
                k += original
            embeddings.weight.data = extended
        else:
            raise ValueError('Please extend "extend_position_embedding" function to support your model type. It '
                             'currently only supports "bert" & "roberta"!')
        model.config.max_position_embeddings = max_position
        print(f"Extended position embeddings to {original * multiples}")
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer, max_position):
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        print(f"updated tokenizer model max imum length to {max_position}")
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(model, max_position,
                                                                sparsity_config=SparsityConfig(num_heads=4)):
        """Every encoder layer's self-attention of a BERT / RoBERTa model replaced by BertSparseSelfAttention
        sharing its query / key / value projections."""
        if hasattr(model, "bert"):
            model.config.max_position_embeddings = max_position
            layers = model.bert.encoder.layer
        elif hasattr(model, "roberta"):
            model.config.max_position_embeddings = max_position + 2
            layers = model.roberta.encoder.layer
        else:
            raise ValueError('Please extend "update_model_self_attention_to_sparse_self_attention" function to '
                             'support your model type. It currently only supports "bert" & "roberta"!')
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(model.config, layers,
                                                                                           sparsity_config)
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(config, layers,
                                                                      sparsity_config=SparsityConfig(num_heads=4)):
        for layer in layers:
            sparse = BertSparseSelfAttention(config, sparsity_config)
            sparse.query = layer.attention.self.query
            sparse.key = layer.attention.self.key
            sparse.value = layer.attention.self.value
            layer.attention.self = sparse
        return layers

    @staticmethod
    def pad_to_block_size(block_size, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          pad_token_id, model_embeddings):
        """The batch padded on the sequence dimension to a multiple of block_size: (pad_len, input_ids,
        attention_mask, token_type_ids, position_ids, inputs_embeds), each padded where given; the padding is not
        attended (attention mask 0), has token type 0 and pad_token_id as its id and position."""
        batch_size, seq_len = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len > 0:
            if inputs_embeds is not None:
                pad_ids = inputs_embeds.new_full((batch_size, pad_len), pad_token_id, dtype=torch.long)
                inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
            if input_ids is not None:
                input_ids = F.pad(input_ids, (0, pad_len), value=pad_token_id)
            if position_ids is not None:
                position_ids = F.pad(position_ids, (0, pad_len), value=pad_token_id)
            if attention_mask is not None:
                attention_mask = F.pad(attention_mask, (0, pad_len), value=False)
            if token_type_ids is not None:
                token_type_ids = F.pad(token_type_ids, (0, pad_len), value=0)
        return pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

    @staticmethod
    def unpad_sequence_output(pad_len, sequence_output):
        if pad_len > 0:
            sequence_output = sequence_output[:, :-pad_len]
        return sequence_output
