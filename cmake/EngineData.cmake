# The data the shipped pipelines read, made at build time from the files scripts/setup.sh fetches
# into data/ (when they are there): the fortunes' conversations (pipelines/chat_sft.pbtxt) and the
# digits as PNG files with conversations naming them (the qwen2_vl recipes, the main job).
# engine_main_job is everything `engine run pipelines/qwen2_vl_r3.pbtxt` needs (and the shipped
# pipelines' data), and no test.
add_custom_target(engine_main_job)
add_dependencies(engine_main_job engine_cli engine_builtin_plugins)

set(ENGINE_FORTUNES ${PROJECT_SOURCE_DIR}/data/fortunes.txt)
set(ENGINE_FORTUNE_CHAT ${PROJECT_SOURCE_DIR}/data/fortune_chat.jsonl)
if(EXISTS ${ENGINE_FORTUNES})
  find_program(ENGINE_PYTHON3 python3 HINTS /usr/bin REQUIRED)
  add_custom_command(OUTPUT ${ENGINE_FORTUNE_CHAT}
    COMMAND ${ENGINE_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/make_fortune_chat.py ${ENGINE_FORTUNES}
      ${ENGINE_FORTUNE_CHAT}
    DEPENDS ${ENGINE_FORTUNES} ${PROJECT_SOURCE_DIR}/scripts/make_fortune_chat.py
    COMMENT "Building data/fortune_chat.jsonl from the fortunes")
  add_custom_target(engine_fortune_chat ALL DEPENDS ${ENGINE_FORTUNE_CHAT})
  # Not the main job's, but pipelines/chat_sft.pbtxt and the examples read it: one short step.
  add_dependencies(engine_main_job engine_fortune_chat)
endif()

# The digit images and a JSON Lines file naming them, written last.
set(ENGINE_DIGITS ${PROJECT_SOURCE_DIR}/data/digits.csv.gz)
set(ENGINE_DIGIT_CHAT ${PROJECT_SOURCE_DIR}/data/digit_chat/digits.jsonl)
if(EXISTS ${ENGINE_DIGITS})
  find_program(ENGINE_PYTHON3 python3 HINTS /usr/bin REQUIRED)
  add_custom_command(OUTPUT ${ENGINE_DIGIT_CHAT}
    COMMAND ${ENGINE_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/make_digit_chat.py ${ENGINE_DIGITS}
      ${PROJECT_SOURCE_DIR}/data/digit_chat
    DEPENDS ${ENGINE_DIGITS} ${PROJECT_SOURCE_DIR}/scripts/make_digit_chat.py
    COMMENT "Building data/digit_chat (digit images and conversations) from the digits")
  add_custom_target(engine_digit_chat ALL DEPENDS ${ENGINE_DIGIT_CHAT})
  add_dependencies(engine_main_job engine_digit_chat)
endif()
