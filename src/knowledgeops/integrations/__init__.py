"""Retrievers for RAG frameworks, backed by the search API through the SDK
(`knowledgeops.client`): each hit comes back as the framework's own type, with its score and
where it came from (file, page, section, chunk id).

- `knowledgeops.integrations.llama_index.KnowledgeOpsRetriever`: a LlamaIndex `BaseRetriever`
  (`NodeWithScore` of `TextNode`); needs the extra: `pip install 'knowledgeops[llamaindex]'`.
- `knowledgeops.integrations.langchain.KnowledgeOpsRetriever`: a LangChain `BaseRetriever`
  (`Document`); needs the extra: `pip install 'knowledgeops[langchain]'`.

Nothing is imported here, so this package itself loads without either framework.
"""
